//! Raw HTTP/2 frames (RFC 9113 §4, §6) and the few HPACK literals (RFC 7541 §6.2) that the
//! hostile-client tests and the connection-cap measurement write by hand (a real HTTP/2 client
//! would not send what they send). Each user takes the part it needs.
#![allow(dead_code)]

pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
pub const DATA: u8 = 0x0;
pub const HEADERS: u8 = 0x1;
pub const RST_STREAM: u8 = 0x3;
pub const SETTINGS: u8 = 0x4;
pub const PING: u8 = 0x6;
pub const WINDOW_UPDATE: u8 = 0x8;
pub const CONTINUATION: u8 = 0x9;
pub const END_STREAM: u8 = 0x1;
pub const END_HEADERS: u8 = 0x4;
pub const ACK: u8 = 0x1;
pub const SETTINGS_INITIAL_WINDOW_SIZE: u16 = 0x4;
pub const CANCEL: u32 = 0x8;

pub fn frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    let len = payload.len() as u32;
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
    out.extend_from_slice(payload);
}

pub fn settings(out: &mut Vec<u8>, pairs: &[(u16, u32)]) {
    let mut payload = Vec::new();
    for (id, value) in pairs {
        payload.extend_from_slice(&id.to_be_bytes());
        payload.extend_from_slice(&value.to_be_bytes());
    }
    frame(out, SETTINGS, 0, 0, &payload);
}

/// The client preface and its SETTINGS.
pub fn preface(settings_pairs: &[(u16, u32)]) -> Vec<u8> {
    let mut out = PREFACE.to_vec();
    settings(&mut out, settings_pairs);
    out
}

fn integer(out: &mut Vec<u8>, prefix_bits: u32, flags: u8, mut value: usize) {
    let max = (1usize << prefix_bits) - 1;
    if value < max {
        out.push(flags | value as u8);
        return;
    }
    out.push(flags | max as u8);
    value -= max;
    while value >= 128 {
        out.push((value % 128) as u8 | 0x80);
        value /= 128;
    }
    out.push(value as u8);
}

fn string(out: &mut Vec<u8>, s: &[u8]) {
    integer(out, 7, 0, s.len());
    out.extend_from_slice(s);
}

/// A literal header field without indexing, its name from the static table.
pub fn literal_indexed_name(out: &mut Vec<u8>, index: usize, value: &[u8]) {
    integer(out, 4, 0, index);
    string(out, value);
}

/// A literal header field without indexing, with a new name.
pub fn literal(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.push(0);
    string(out, name);
    string(out, value);
}

/// `POST /mutate` headers as a header block.
pub fn post_mutate(content_length: Option<usize>) -> Vec<u8> {
    // :method POST (static 3), :scheme https (static 7).
    let mut block = vec![0x83, 0x87];
    literal_indexed_name(&mut block, 4, b"/mutate"); // :path
    literal_indexed_name(&mut block, 1, b"localhost"); // :authority
    literal_indexed_name(&mut block, 31, b"application/json"); // content-type
    if let Some(n) = content_length {
        literal_indexed_name(&mut block, 28, n.to_string().as_bytes()); // content-length
    }
    block
}
