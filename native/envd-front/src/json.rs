//! A small JSON reader and writer: what envd's request bodies and answers need, nothing more.

#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Bool(bool),
    Num(f64),
    Str(String),
    Arr(Vec<Value>),
    Obj(Vec<(String, Value)>),
}

impl Value {
    pub fn get(&self, key: &str) -> Option<&Value> {
        match self {
            Value::Obj(fields) => fields.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }
}

/// Parses a whole document; None for anything malformed (the caller leaves it to Node's envd,
/// whose error is the contract's).
pub fn parse(text: &[u8]) -> Option<Value> {
    let mut p = Parser {
        s: text,
        i: 0,
        depth: 0,
    };
    let v = p.value()?;
    p.ws();
    if p.i == p.s.len() {
        Some(v)
    } else {
        None
    }
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
    depth: u32,
}

impl<'a> Parser<'a> {
    fn ws(&mut self) {
        while self.i < self.s.len() && matches!(self.s[self.i], b' ' | b'\t' | b'\n' | b'\r') {
            self.i += 1;
        }
    }
    fn eat(&mut self, lit: &[u8]) -> bool {
        if self.s[self.i..].starts_with(lit) {
            self.i += lit.len();
            true
        } else {
            false
        }
    }
    fn value(&mut self) -> Option<Value> {
        self.ws();
        let c = *self.s.get(self.i)?;
        match c {
            b'n' => self.eat(b"null").then_some(Value::Null),
            b't' => self.eat(b"true").then_some(Value::Bool(true)),
            b'f' => self.eat(b"false").then_some(Value::Bool(false)),
            b'"' => self.string().map(Value::Str),
            b'[' => {
                self.depth += 1;
                if self.depth > 64 {
                    return None;
                }
                self.i += 1;
                let mut items = Vec::new();
                self.ws();
                if self.eat(b"]") {
                    self.depth -= 1;
                    return Some(Value::Arr(items));
                }
                loop {
                    items.push(self.value()?);
                    self.ws();
                    if self.eat(b",") {
                        continue;
                    }
                    if self.eat(b"]") {
                        break;
                    }
                    return None;
                }
                self.depth -= 1;
                Some(Value::Arr(items))
            }
            b'{' => {
                self.depth += 1;
                if self.depth > 64 {
                    return None;
                }
                self.i += 1;
                let mut fields = Vec::new();
                self.ws();
                if self.eat(b"}") {
                    self.depth -= 1;
                    return Some(Value::Obj(fields));
                }
                loop {
                    self.ws();
                    if self.s.get(self.i) != Some(&b'"') {
                        return None;
                    }
                    let k = self.string()?;
                    self.ws();
                    if !self.eat(b":") {
                        return None;
                    }
                    let v = self.value()?;
                    fields.push((k, v));
                    self.ws();
                    if self.eat(b",") {
                        continue;
                    }
                    if self.eat(b"}") {
                        break;
                    }
                    return None;
                }
                self.depth -= 1;
                Some(Value::Obj(fields))
            }
            b'-' | b'0'..=b'9' => {
                let start = self.i;
                while self.i < self.s.len()
                    && matches!(
                        self.s[self.i],
                        b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9'
                    )
                {
                    self.i += 1;
                }
                let text = std::str::from_utf8(&self.s[start..self.i]).ok()?;
                // JSON's grammar is stricter than Rust's float syntax on a few forms ("01", "1.").
                let b = text.as_bytes();
                let digits = if b[0] == b'-' { &b[1..] } else { b };
                if digits.is_empty()
                    || !digits[0].is_ascii_digit()
                    || (digits[0] == b'0' && digits.len() > 1 && digits[1].is_ascii_digit())
                    || text.contains(".e")
                    || text.contains(".E")
                    || text.ends_with('.')
                {
                    return None;
                }
                text.parse::<f64>()
                    .ok()
                    .filter(|n| n.is_finite())
                    .map(Value::Num)
            }
            _ => None,
        }
    }
    fn hex4(&mut self) -> Option<u32> {
        let h = self.s.get(self.i..self.i + 4)?;
        let v = u32::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok()?;
        self.i += 4;
        Some(v)
    }
    fn string(&mut self) -> Option<String> {
        self.i += 1;
        let mut out: Vec<u8> = Vec::new();
        loop {
            let c = *self.s.get(self.i)?;
            self.i += 1;
            match c {
                b'"' => return String::from_utf8(out).ok(),
                b'\\' => {
                    let e = *self.s.get(self.i)?;
                    self.i += 1;
                    let ch = match e {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => {
                            let hi = self.hex4()?;
                            let code = if (0xd800..0xdc00).contains(&hi) {
                                // A lone surrogate is not text Rust can hold: Node would keep it.
                                if !self.eat(b"\\u") {
                                    return None;
                                }
                                let lo = self.hex4()?;
                                if !(0xdc00..0xe000).contains(&lo) {
                                    return None;
                                }
                                0x10000 + ((hi - 0xd800) << 10) + (lo - 0xdc00)
                            } else if (0xdc00..0xe000).contains(&hi) {
                                return None;
                            } else {
                                hi
                            };
                            char::from_u32(code)?
                        }
                        _ => return None,
                    };
                    let mut buf = [0u8; 4];
                    out.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
                }
                0..=0x1f => return None,
                _ => out.push(c),
            }
        }
    }
}

/// `text` as a JSON string, as JSON.stringify writes it.
pub fn quote(out: &mut String, text: &str) {
    out.push('"');
    for ch in text.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                out.push_str(&format!("\\u{:04x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

pub fn quoted(text: &str) -> String {
    let mut s = String::with_capacity(text.len() + 2);
    quote(&mut s, text);
    s
}

/// A number as JSON.stringify writes a safe integer or a float.
pub fn num(n: f64) -> String {
    if n.fract() == 0.0 && n.abs() < 9.007_199_254_740_992e15 {
        format!("{}", n as i64)
    } else {
        format!("{}", n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn parses_and_quotes() {
        let v = parse(br#"{"cmd":"echo \"hi\"\n","env":{"A":"\u00e9\ud83d\ude00"},"timeout":1.5,"stdin":false,"argv":["a"]}"#).unwrap();
        assert_eq!(v.get("cmd"), Some(&Value::Str("echo \"hi\"\n".into())));
        assert_eq!(
            v.get("env").unwrap().get("A"),
            Some(&Value::Str("é😀".into()))
        );
        assert_eq!(v.get("timeout"), Some(&Value::Num(1.5)));
        assert_eq!(quoted("a\"\\\u{1}\n"), "\"a\\\"\\\\\\u0001\\n\"");
        for bad in [
            &b"{"[..],
            b"01",
            b"1.",
            b"\"\\ud800\"",
            b"{\"a\":1,}",
            b"[1] x",
            b"\"\x01\"",
        ] {
            assert_eq!(parse(bad), None, "{:?}", std::str::from_utf8(bad));
        }
        assert_eq!(num(3.0), "3");
        assert_eq!(num(0.25), "0.25");
    }
}
