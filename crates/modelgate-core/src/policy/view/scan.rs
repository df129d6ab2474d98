//! A serde `Deserializer` over JSON text for the request path's first attempt: the views and the
//! envelope are decoded through it, and the values no rule reads are skipped by a structural scan
//! of their text instead of serde_json's `ignore_value` (which was ~half of the decode).
//!
//! Contract: it accepts a *subset* of what serde_json accepts, and where it accepts it gives the
//! visitors exactly what serde_json would (same calls, same borrowed or copied strings, the same
//! raw text for a `RawValue`). Anything else — malformed JSON, a type a visitor refuses, but also
//! rarer forms it does not handle (floats, `-0`, 19-digit integers, a key with an escape, more
//! than 128 levels of nesting, an enum written as a map) — is [`Bail`], and the caller decodes
//! the same text again with serde_json, which accepts or refuses it and names the field. So a
//! body is never accepted here that serde_json would refuse: skipped values are checked as
//! serde_json's `ignore_value` checks them (string escapes including `\u` with four hex digits,
//! control characters, the number grammar, literals, brackets and commas), and read values as its
//! typed decode does.
//!
//! The text is a `&str`: its UTF-8 is the caller's to have checked, once for the whole body.

use std::fmt;

use serde::de::value::{BorrowedStrDeserializer, StringDeserializer};
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

/// The text cannot be decoded here; serde_json decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bail;

impl fmt::Display for Bail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("not decoded by the fast path")
    }
}

impl std::error::Error for Bail {}

impl de::Error for Bail {
    // The message is dropped: serde_json decodes the text again and says what is wrong.
    fn custom<T: fmt::Display>(_msg: T) -> Self {
        Bail
    }
}

type Result<T> = std::result::Result<T, Bail>;

/// serde_json's private name for `RawValue`, which its `Deserialize` impl asks for with
/// `deserialize_newtype_struct`; honouring it lets the views keep `&RawValue` fields. If
/// serde_json ever renames it, every body with a raw field bails to serde_json (slower, same
/// answers), and the test that the reference reviews take this path fails.
const RAW_VALUE_TOKEN: &str = "$serde_json::private::RawValue";

/// Nested arrays and objects decoded (not skipped) at most: below serde_json's own limit (127),
/// which the views never come near.
const MAX_DECODED_DEPTH: u32 = 100;

/// Nested arrays and objects in a skipped value at most (one bit each of the skipper's stack).
/// serde_json has no limit there: deeper text bails to it.
const MAX_SKIPPED_DEPTH: u32 = 128;

/// Decodes `text` as `T` if this decoder can, else [`Bail`].
pub fn from_str<'a, T: de::Deserialize<'a>>(text: &'a str) -> Result<T> {
    let mut scanner = Scanner {
        text,
        bytes: text.as_bytes(),
        pos: 0,
        depth: 0,
    };
    let value = T::deserialize(&mut scanner)?;
    // Only whitespace may follow, as for `serde_json::from_str`.
    match scanner.peek() {
        None => Ok(value),
        Some(_) => Err(Bail),
    }
}

pub struct Scanner<'a> {
    text: &'a str,
    bytes: &'a [u8],
    pos: usize,
    /// Arrays and objects being decoded (not skipped) around the current position.
    depth: u32,
}

/// Bytes that end the fast part of a string: `"`, `\` and the control characters JSON forbids.
const fn string_stop(b: u8) -> bool {
    b == b'"' || b == b'\\' || b < 0x20
}

const ONES: u64 = u64::MAX / 255;
const HIGHS: u64 = ONES << 7;

/// Whether any byte of `chunk` (8 bytes, little-endian) is a [`string_stop`] byte: the
/// has-zero-byte and has-less-than tricks on a word, so a string is scanned 8 bytes a step.
#[inline(always)]
fn has_stop(chunk: u64) -> u64 {
    let quote = chunk ^ (ONES * u64::from(b'"'));
    let backslash = chunk ^ (ONES * u64::from(b'\\'));
    let has_quote = quote.wrapping_sub(ONES) & !quote;
    let has_backslash = backslash.wrapping_sub(ONES) & !backslash;
    let has_control = chunk.wrapping_sub(ONES * 0x20) & !chunk;
    (has_quote | has_backslash | has_control) & HIGHS
}

fn hex(b: u8) -> Option<u32> {
    match b {
        b'0'..=b'9' => Some(u32::from(b - b'0')),
        b'a'..=b'f' => Some(u32::from(b - b'a' + 10)),
        b'A'..=b'F' => Some(u32::from(b - b'A' + 10)),
        _ => None,
    }
}

impl<'a> Scanner<'a> {
    /// The next byte that is not JSON whitespace, not consumed.
    #[inline(always)]
    fn peek(&mut self) -> Option<u8> {
        while let Some(&b) = self.bytes.get(self.pos) {
            match b {
                b' ' | b'\n' | b'\t' | b'\r' => self.pos += 1,
                _ => return Some(b),
            }
        }
        None
    }

    #[inline(always)]
    fn expect(&mut self, byte: u8) -> Result<()> {
        if self.peek() == Some(byte) {
            self.pos += 1;
            Ok(())
        } else {
            Err(Bail)
        }
    }

    #[inline(always)]
    fn literal(&mut self, word: &[u8]) -> Result<()> {
        match self.bytes.get(self.pos..self.pos + word.len()) {
            Some(w) if w == word => {
                self.pos += word.len();
                Ok(())
            }
            _ => Err(Bail),
        }
    }

    /// Moves to the first [`string_stop`] byte at or after the position; `Bail` at the end.
    #[inline(always)]
    fn advance_to_string_stop(&mut self) -> Result<u8> {
        let bytes = self.bytes;
        let mut pos = self.pos;
        while let Some(chunk) = bytes.get(pos..pos + 8) {
            let word = u64::from_le_bytes(chunk.try_into().map_err(|_| Bail)?);
            let found = has_stop(word);
            if found != 0 {
                pos += found.trailing_zeros() as usize / 8;
                self.pos = pos;
                return Ok(bytes[pos]);
            }
            pos += 8;
        }
        while let Some(&b) = bytes.get(pos) {
            if string_stop(b) {
                self.pos = pos;
                return Ok(b);
            }
            pos += 1;
        }
        Err(Bail)
    }

    /// Four hex digits after `\u`, as serde_json reads them.
    fn hex4(&mut self) -> Result<u32> {
        let digits = self.bytes.get(self.pos..self.pos + 4).ok_or(Bail)?;
        let mut n = 0;
        for &d in digits {
            n = n * 16 + hex(d).ok_or(Bail)?;
        }
        self.pos += 4;
        Ok(n)
    }

    /// Skips a string whose opening quote is consumed, checking it as serde_json's `ignore_str`
    /// does: no control characters, escapes among `"\/bfnrtu`, `\u` with four hex digits (a lone
    /// surrogate is not an error in a skipped string, as in serde_json).
    ///
    /// Inlined: most strings are a few words long, and a call (saved registers, the scan's
    /// constants loaded again) cost as much as scanning them.
    #[inline(always)]
    fn skip_str(&mut self) -> Result<()> {
        match self.advance_to_string_stop()? {
            b'"' => {
                self.pos += 1;
                Ok(())
            }
            _ => self.skip_str_escaped(),
        }
    }

    /// [`Scanner::skip_str`] from its first escape (or control character) on.
    #[cold]
    fn skip_str_escaped(&mut self) -> Result<()> {
        loop {
            match self.bytes.get(self.pos).copied().ok_or(Bail)? {
                b'"' => {
                    self.pos += 1;
                    return Ok(());
                }
                b'\\' => {
                    let escape = *self.bytes.get(self.pos + 1).ok_or(Bail)?;
                    self.pos += 2;
                    match escape {
                        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => {}
                        b'u' => {
                            self.hex4()?;
                        }
                        _ => return Err(Bail),
                    }
                }
                _ => return Err(Bail),
            }
            self.advance_to_string_stop()?;
        }
    }

    /// A string whose opening quote is consumed: borrowed from the text when it has no escape,
    /// else unescaped into `owned` (surrogates must pair, as serde_json requires of a string it
    /// decodes).
    #[inline(always)]
    fn read_str(&mut self, owned: &mut String) -> Result<Option<&'a str>> {
        let start = self.pos;
        match self.advance_to_string_stop()? {
            b'"' => {
                let s = self.text.get(start..self.pos).ok_or(Bail)?;
                self.pos += 1;
                Ok(Some(s))
            }
            b'\\' => self.read_str_escaped(start, owned).map(|()| None),
            _ => Err(Bail),
        }
    }

    /// [`Scanner::read_str`] from the first escape, at the position, on.
    #[cold]
    fn read_str_escaped(&mut self, start: usize, owned: &mut String) -> Result<()> {
        owned.clear();
        owned.push_str(self.text.get(start..self.pos).ok_or(Bail)?);
        loop {
            // At a backslash.
            let escape = *self.bytes.get(self.pos + 1).ok_or(Bail)?;
            self.pos += 2;
            let c = match escape {
                b'"' => '"',
                b'\\' => '\\',
                b'/' => '/',
                b'b' => '\u{8}',
                b'f' => '\u{c}',
                b'n' => '\n',
                b'r' => '\r',
                b't' => '\t',
                b'u' => {
                    let n = self.hex4()?;
                    let code = match n {
                        0xD800..=0xDBFF => {
                            if self.bytes.get(self.pos..self.pos + 2) != Some(b"\\u") {
                                return Err(Bail);
                            }
                            self.pos += 2;
                            let low = self.hex4()?;
                            if !(0xDC00..=0xDFFF).contains(&low) {
                                return Err(Bail);
                            }
                            0x10000 + ((n - 0xD800) << 10) + (low - 0xDC00)
                        }
                        0xDC00..=0xDFFF => return Err(Bail),
                        n => n,
                    };
                    char::from_u32(code).ok_or(Bail)?
                }
                _ => return Err(Bail),
            };
            owned.push(c);
            let from = self.pos;
            let stop = self.advance_to_string_stop()?;
            owned.push_str(self.text.get(from..self.pos).ok_or(Bail)?);
            match stop {
                b'"' => {
                    self.pos += 1;
                    return Ok(());
                }
                b'\\' => {}
                _ => return Err(Bail),
            }
        }
    }

    /// Skips a number as serde_json's `ignore_integer` and the rest do: `-?(0|[1-9][0-9]*)`,
    /// then an optional fraction and exponent, each with at least one digit.
    fn skip_number(&mut self) -> Result<()> {
        let bytes = self.bytes;
        let mut pos = self.pos;
        if bytes.get(pos) == Some(&b'-') {
            pos += 1;
        }
        let digits = |pos: &mut usize| {
            let start = *pos;
            while bytes.get(*pos).is_some_and(u8::is_ascii_digit) {
                *pos += 1;
            }
            *pos - start
        };
        match bytes.get(pos) {
            Some(b'0') => {
                pos += 1;
                if bytes.get(pos).is_some_and(u8::is_ascii_digit) {
                    return Err(Bail);
                }
            }
            Some(b'1'..=b'9') => {
                digits(&mut pos);
            }
            _ => return Err(Bail),
        }
        if bytes.get(pos) == Some(&b'.') {
            pos += 1;
            if digits(&mut pos) == 0 {
                return Err(Bail);
            }
        }
        if let Some(b'e' | b'E') = bytes.get(pos) {
            pos += 1;
            if let Some(b'+' | b'-') = bytes.get(pos) {
                pos += 1;
            }
            if digits(&mut pos) == 0 {
                return Err(Bail);
            }
        }
        self.pos = pos;
        Ok(())
    }

    /// Skips one value, checking that it is well-formed JSON: iterative, with the open
    /// brackets as bits of a word (1 for an object).
    fn skip_value(&mut self) -> Result<()> {
        let mut open: u128 = 0;
        let mut depth: u32 = 0;
        loop {
            // A value is expected here.
            match self.peek().ok_or(Bail)? {
                b'"' => {
                    self.pos += 1;
                    self.skip_str()?;
                }
                b'-' | b'0'..=b'9' => self.skip_number()?,
                b't' => self.literal(b"true")?,
                b'f' => self.literal(b"false")?,
                b'n' => self.literal(b"null")?,
                bracket @ (b'{' | b'[') => {
                    if depth == MAX_SKIPPED_DEPTH {
                        return Err(Bail);
                    }
                    self.pos += 1;
                    let object = bracket == b'{';
                    let close = if object { b'}' } else { b']' };
                    if self.peek() == Some(close) {
                        // Empty: a complete value, handled below like any other.
                        self.pos += 1;
                    } else {
                        open = (open << 1) | u128::from(object);
                        depth += 1;
                        if object {
                            self.expect(b'"')?;
                            self.skip_str()?;
                            self.expect(b':')?;
                        }
                        continue;
                    }
                }
                _ => return Err(Bail),
            }
            // After a complete value: a comma and the next member, or closing brackets.
            loop {
                if depth == 0 {
                    return Ok(());
                }
                let object = open & 1 == 1;
                match self.peek() {
                    Some(b',') => {
                        self.pos += 1;
                        if object {
                            self.expect(b'"')?;
                            self.skip_str()?;
                            self.expect(b':')?;
                        }
                        break;
                    }
                    Some(b'}') if object => {}
                    Some(b']') if !object => {}
                    _ => return Err(Bail),
                }
                self.pos += 1;
                open >>= 1;
                depth -= 1;
            }
        }
    }

    /// A non-negative or negative integer as serde_json reads one for an integer type: it
    /// visits a `u64` for a non-negative number and an `i64` for a negative one. Forms whose
    /// reading differs (a fraction or exponent, which serde_json reads as a float, `-0`, and
    /// anything past 18 digits, which might overflow) bail.
    fn integer<V: Visitor<'a>>(&mut self, visitor: V) -> Result<V::Value> {
        let negative = self.peek() == Some(b'-');
        let bytes = self.bytes;
        let mut pos = self.pos;
        if negative {
            pos += 1;
        }
        let start = pos;
        let mut n: u64 = 0;
        while let Some(&d) = bytes.get(pos).filter(|d| d.is_ascii_digit()) {
            if pos - start == 18 {
                return Err(Bail);
            }
            n = n * 10 + u64::from(d - b'0');
            pos += 1;
        }
        let len = pos - start;
        let leading_zero = bytes[start..pos].first() == Some(&b'0');
        if len == 0
            || (leading_zero && (len > 1 || negative))
            || matches!(bytes.get(pos), Some(b'.' | b'e' | b'E'))
        {
            return Err(Bail);
        }
        self.pos = pos;
        if negative {
            // At most 18 digits: fits an i64.
            visitor.visit_i64(-(n as i64))
        } else {
            visitor.visit_u64(n)
        }
    }

    fn nested<T>(&mut self, f: impl FnOnce(&mut Self) -> Result<T>) -> Result<T> {
        if self.depth == MAX_DECODED_DEPTH {
            return Err(Bail);
        }
        self.depth += 1;
        let value = f(self);
        self.depth -= 1;
        value
    }

    fn string<V: Visitor<'a>>(&mut self, visitor: V) -> Result<V::Value> {
        self.expect(b'"')?;
        let mut owned = String::new();
        match self.read_str(&mut owned)? {
            Some(s) => visitor.visit_borrowed_str(s),
            None => visitor.visit_str(&owned),
        }
    }
}

impl<'de> Deserializer<'de> for &mut Scanner<'de> {
    type Error = Bail;

    /// Used by no view; whatever would need it is left to serde_json.
    fn deserialize_any<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value> {
        Err(Bail)
    }

    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        match self.peek() {
            Some(b't') => {
                self.literal(b"true")?;
                visitor.visit_bool(true)
            }
            Some(b'f') => {
                self.literal(b"false")?;
                visitor.visit_bool(false)
            }
            _ => Err(Bail),
        }
    }

    fn deserialize_i8<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.integer(visitor)
    }

    fn deserialize_i16<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.integer(visitor)
    }

    fn deserialize_i32<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.integer(visitor)
    }

    fn deserialize_i64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.integer(visitor)
    }

    fn deserialize_u8<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.integer(visitor)
    }

    fn deserialize_u16<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.integer(visitor)
    }

    fn deserialize_u32<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.integer(visitor)
    }

    fn deserialize_u64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.integer(visitor)
    }

    fn deserialize_f32<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value> {
        Err(Bail)
    }

    fn deserialize_f64<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value> {
        Err(Bail)
    }

    fn deserialize_char<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value> {
        Err(Bail)
    }

    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.string(visitor)
    }

    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.string(visitor)
    }

    fn deserialize_bytes<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value> {
        Err(Bail)
    }

    fn deserialize_byte_buf<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value> {
        Err(Bail)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        if self.peek() == Some(b'n') {
            self.literal(b"null")?;
            visitor.visit_none()
        } else {
            visitor.visit_some(self)
        }
    }

    fn deserialize_unit<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        if self.peek() != Some(b'n') {
            return Err(Bail);
        }
        self.literal(b"null")?;
        visitor.visit_unit()
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value> {
        self.deserialize_unit(visitor)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value> {
        if name != RAW_VALUE_TOKEN {
            return visitor.visit_newtype_struct(self);
        }
        // The value's text, from its first byte to its last, as serde_json delimits it.
        self.peek();
        let start = self.pos;
        self.skip_value()?;
        let raw = self.text.get(start..self.pos).ok_or(Bail)?;
        visitor.visit_map(RawValueAccess { raw: Some(raw) })
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.expect(b'[')?;
        self.nested(|s| {
            let value = visitor.visit_seq(Elements {
                scanner: &mut *s,
                first: true,
            })?;
            s.expect(b']')?;
            Ok(value)
        })
    }

    fn deserialize_tuple<V: Visitor<'de>>(self, _len: usize, _visitor: V) -> Result<V::Value> {
        Err(Bail)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _len: usize,
        _visitor: V,
    ) -> Result<V::Value> {
        Err(Bail)
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.expect(b'{')?;
        self.nested(|s| {
            let value = visitor.visit_map(Members {
                scanner: &mut *s,
                first: true,
            })?;
            s.expect(b'}')?;
            Ok(value)
        })
    }

    /// Only the object form (serde_json also reads a struct from an array: that bails).
    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value> {
        self.deserialize_map(visitor)
    }

    /// Only a unit variant written as a string, read as serde_json reads it.
    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value> {
        self.expect(b'"')?;
        let mut owned = String::new();
        match self.read_str(&mut owned)? {
            Some(s) => visitor.visit_enum(BorrowedStrDeserializer::<Bail>::new(s)),
            None => Err(Bail),
        }
    }

    fn deserialize_identifier<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.string(visitor)
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.skip_value()?;
        visitor.visit_unit()
    }
}

/// The elements of an array being decoded.
struct Elements<'s, 'a> {
    scanner: &'s mut Scanner<'a>,
    first: bool,
}

impl<'de> SeqAccess<'de> for Elements<'_, 'de> {
    type Error = Bail;

    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>> {
        match self.scanner.peek() {
            Some(b']') => return Ok(None),
            Some(b',') if !self.first => self.scanner.pos += 1,
            Some(_) if self.first => {}
            _ => return Err(Bail),
        }
        self.first = false;
        seed.deserialize(&mut *self.scanner).map(Some)
    }
}

/// The members of an object being decoded.
struct Members<'s, 'a> {
    scanner: &'s mut Scanner<'a>,
    first: bool,
}

impl<'de> MapAccess<'de> for Members<'_, 'de> {
    type Error = Bail;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>> {
        match self.scanner.peek() {
            Some(b'}') => return Ok(None),
            Some(b',') if !self.first => self.scanner.pos += 1,
            Some(_) if self.first => {}
            _ => return Err(Bail),
        }
        self.first = false;
        self.scanner.expect(b'"')?;
        let mut owned = String::new();
        let key = match self.scanner.read_str(&mut owned)? {
            Some(key) => seed.deserialize(BorrowedStrDeserializer::<Bail>::new(key))?,
            // serde_json visits a copied key too (`visit_str`); a visitor reads both alike.
            None => seed.deserialize(StringDeserializer::<Bail>::new(owned))?,
        };
        self.scanner.expect(b':')?;
        Ok(Some(key))
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value> {
        seed.deserialize(&mut *self.scanner)
    }
}

/// What serde_json hands `RawValue`'s visitor: a map of one entry, its private token to the
/// value's text.
struct RawValueAccess<'a> {
    raw: Option<&'a str>,
}

impl<'de> MapAccess<'de> for RawValueAccess<'de> {
    type Error = Bail;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>> {
        if self.raw.is_none() {
            return Ok(None);
        }
        seed.deserialize(BorrowedStrDeserializer::<Bail>::new(RAW_VALUE_TOKEN))
            .map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value> {
        let raw = self.raw.take().ok_or(Bail)?;
        seed.deserialize(BorrowedStrDeserializer::<Bail>::new(raw))
    }
}

#[cfg(test)]
#[path = "scan_tests.rs"]
mod tests;
