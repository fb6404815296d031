//! A bounded buffer keeping the last bytes of a command's output.

use std::collections::VecDeque;

/// How much of a command's combined stdout/stderr is kept: the last 64 KiB.
pub const OUTPUT_LIMIT: usize = 64 * 1024;

/// Keeps the last `cap` bytes written to it, and counts what it dropped.
#[derive(Debug, Clone)]
pub struct Tail {
    buf: VecDeque<u8>,
    cap: usize,
    dropped: u64,
    /// The newest byte dropped, if any.
    last_dropped: Option<u8>,
}

impl Tail {
    /// An empty tail keeping at most `cap` bytes.
    pub fn new(cap: usize) -> Self {
        Self {
            buf: VecDeque::with_capacity(cap.min(8192)),
            cap,
            dropped: 0,
            last_dropped: None,
        }
    }

    /// Appends `bytes`, dropping the oldest bytes beyond the cap.
    pub fn push(&mut self, bytes: &[u8]) {
        let skip = bytes.len().saturating_sub(self.cap);
        let keep = &bytes[skip..];
        self.dropped += skip as u64;
        let overflow = (self.buf.len() + keep.len()).saturating_sub(self.cap);
        // The buffer's bytes are older than any of `bytes`.
        if skip > 0 {
            self.last_dropped = Some(bytes[skip - 1]);
        } else if overflow > 0 {
            self.last_dropped = self.buf.get(overflow - 1).copied();
        }
        self.buf.drain(..overflow);
        self.dropped += overflow as u64;
        self.buf.extend(keep);
    }

    /// Bytes dropped from the front so far.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Whether the kept bytes start a line: nothing was dropped, or the last byte
    /// dropped ended a line.
    pub fn starts_a_line(&self) -> bool {
        self.dropped == 0 || self.last_dropped == Some(b'\n')
    }

    /// The kept bytes as text (invalid UTF-8, e.g. a character cut at the front, is
    /// replaced).
    pub fn text(&self) -> String {
        let (a, b) = self.buf.as_slices();
        let mut bytes = Vec::with_capacity(a.len() + b.len());
        bytes.extend_from_slice(a);
        bytes.extend_from_slice(b);
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

/// The last at most `max` bytes of `text`, cut at a character boundary.
pub fn last_bytes(text: &str, max: usize) -> &str {
    let mut start = text.len().saturating_sub(max);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    &text[start..]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_only_the_last_bytes() {
        let mut t = Tail::new(5);
        t.push(b"abc");
        t.push(b"defg");
        assert_eq!(t.text(), "cdefg");
        assert_eq!(t.dropped(), 2);
        t.push(b"0123456789");
        assert_eq!(t.text(), "56789");
        assert_eq!(t.dropped(), 12);
        assert!(!t.starts_a_line());
        t.push(b"ab\ncd");
        assert_eq!(t.text(), "ab\ncd");
        assert!(!t.starts_a_line(), "the '9' before it was dropped");
        t.push(b"xyz");
        assert_eq!(t.text(), "cdxyz");
        assert!(t.starts_a_line(), "the last byte dropped ended a line");
    }

    #[test]
    fn last_bytes_cuts_at_a_character_boundary() {
        assert_eq!(last_bytes("héllo", 4), "llo");
        assert_eq!(last_bytes("héllo", 5), "éllo");
        assert_eq!(last_bytes("abc", 10), "abc");
    }
}
