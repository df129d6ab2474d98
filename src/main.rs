use std::process::ExitCode;

fn main() -> ExitCode {
    modelgate::cli::main()
}
