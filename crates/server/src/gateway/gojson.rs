//! JSON as Go's `encoding/json` reads it, for the JSON gateway's request bodies: etcd's
//! grpc-gateway decodes them with Go's `json.Decoder` and `json.Unmarshal`, and clients see
//! Go's texts for malformed input (`invalid character '}' looking for beginning of value`,
//! `unexpected EOF`, `unexpected end of JSON input`). This module owns the syntax and those
//! texts; what a value means for a protobuf message is `jsonpb`'s.
//!
//! [`Scanner`] is fed one byte at a time and keeps its state between calls, so a body that
//! arrives in many pieces is scanned once (each byte once), and says where the first complete
//! value ends. [`parse`] reads a complete input into a [`Json`] tree, with `json.Unmarshal`'s
//! rules: one value, only whitespace after it.

/// A parsed JSON value. Numbers keep their text (Go converts them per target type); strings
/// keep their source text too, because jsonpb reads a quoted integer's text without unescaping.
#[derive(Clone, Debug, PartialEq)]
pub enum Json {
    Null,
    Bool(bool),
    Number(String),
    String {
        value: String,
        raw: String,
    },
    Array(Vec<Json>),
    /// Members in their order; duplicates kept (the reader decides which one counts).
    Object(Vec<(String, Json)>),
}

/// Dropped without recursion, for the same reason the tree is read without it: a value nested
/// 10,000 deep would otherwise take 10,000 drop frames.
impl Drop for Json {
    fn drop(&mut self) {
        let nested = |value: &Json| match value {
            Json::Array(items) => !items.is_empty(),
            Json::Object(members) => !members.is_empty(),
            _ => false,
        };
        let has_nested = match self {
            Json::Array(items) => items.iter().any(nested),
            Json::Object(members) => members.iter().any(|(_, value)| nested(value)),
            _ => false,
        };
        if !has_nested {
            return;
        }
        let mut pending = Vec::new();
        take_children(self, &mut pending);
        while let Some(mut value) = pending.pop() {
            take_children(&mut value, &mut pending);
        }
    }
}

/// Moves a container's children into `pending`, leaving it empty.
fn take_children(value: &mut Json, pending: &mut Vec<Json>) {
    match value {
        Json::Array(items) => pending.append(items),
        Json::Object(members) => pending.extend(members.drain(..).map(|(_, value)| value)),
        _ => {}
    }
}

impl Json {
    /// The word Go's `UnmarshalTypeError` uses for this kind of value.
    pub fn kind(&self) -> &'static str {
        match self {
            Json::Null => "null",
            Json::Bool(_) => "bool",
            Json::Number(_) => "number",
            Json::String { .. } => "string",
            Json::Array(_) => "array",
            Json::Object(_) => "object",
        }
    }
}

/// What the enclosing container expects next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Frame {
    ObjectKey,
    ObjectValue,
    ArrayValue,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// A value must start; `close` allows `]` (right after `[`).
    BeginValue {
        close: bool,
    },
    /// An object key must start; `close` allows `}` (right after `{`).
    BeginKey {
        close: bool,
    },
    InString,
    InStringEscape,
    /// Hex digits of a `\u` escape still to come.
    InStringUnicode(u8),
    Minus,
    Zero,
    Digits,
    Dot,
    Fraction,
    Exponent,
    ExponentSign,
    ExponentDigits,
    /// Inside `true`, `false` or `null`, at byte `at`.
    Literal {
        word: &'static str,
        at: u8,
    },
    EndValue,
    /// The top-level value is complete.
    Done,
}

/// What one byte did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// The value goes on.
    More,
    /// The top-level value ended with this byte.
    EndedWith,
    /// The top-level value had ended before this byte, which is not part of it.
    EndedBefore,
}

/// Go's JSON scanner (`encoding/json/scanner.go`'s states and error texts), one value at a
/// time. Depth is bounded as Go's is.
#[derive(Debug)]
pub struct Scanner {
    state: State,
    stack: Vec<Frame>,
    /// Whether a byte other than whitespace has been seen.
    started: bool,
}

/// Go's nesting limit (`maxNestingDepth`).
const MAX_DEPTH: usize = 10_000;

impl Default for Scanner {
    fn default() -> Self {
        Scanner {
            state: State::BeginValue { close: false },
            stack: Vec::new(),
            started: false,
        }
    }
}

fn is_space(c: u8) -> bool {
    matches!(c, b' ' | b'\t' | b'\r' | b'\n')
}

/// Go's `quoteChar`: how an offending byte is shown in a syntax error.
fn quote_char(c: u8) -> String {
    match c {
        b'\'' => r"'\''".to_owned(),
        b'"' => "'\"'".to_owned(),
        0x07 => r"'\a'".to_owned(),
        0x08 => r"'\b'".to_owned(),
        0x0c => r"'\f'".to_owned(),
        b'\n' => r"'\n'".to_owned(),
        b'\r' => r"'\r'".to_owned(),
        b'\t' => r"'\t'".to_owned(),
        0x0b => r"'\v'".to_owned(),
        b'\\' => r"'\\'".to_owned(),
        0x00..=0x1f | 0x7f => format!(r"'\x{c:02x}'"),
        0x20..=0x7e => format!("'{}'", c as char),
        // Go quotes the rune with this code point: C1 controls and non-printing Latin-1
        // (no-break space, soft hyphen) as \u escapes.
        0x80..=0xa0 | 0xad => format!(r"'\u{c:04x}'"),
        _ => format!("'{}'", char::from(c)),
    }
}

fn syntax_error(c: u8, context: &str) -> String {
    format!("invalid character {} {context}", quote_char(c))
}

impl Scanner {
    /// Feeds the next byte. Errors carry Go's text. After [`Step::EndedWith`] or
    /// [`Step::EndedBefore`], [`Scanner::reset`] starts the next value.
    pub fn step(&mut self, c: u8) -> Result<Step, String> {
        if !is_space(c) {
            self.started = true;
        }
        match self.state {
            State::Done => Ok(Step::EndedBefore),
            State::BeginValue { close } => self.begin_value(c, close),
            State::BeginKey { close } => {
                if is_space(c) {
                    return Ok(Step::More);
                }
                if c == b'"' {
                    self.state = State::InString;
                    return Ok(Step::More);
                }
                if close && c == b'}' {
                    if let Some(top) = self.stack.last_mut() {
                        *top = Frame::ObjectValue;
                    }
                    return self.end_value(c);
                }
                Err(syntax_error(
                    c,
                    "looking for beginning of object key string",
                ))
            }
            State::InString => {
                match c {
                    b'"' => self.state = State::EndValue,
                    b'\\' => self.state = State::InStringEscape,
                    0x00..=0x1f => return Err(syntax_error(c, "in string literal")),
                    _ => {}
                }
                Ok(Step::More)
            }
            State::InStringEscape => {
                match c {
                    b'b' | b'f' | b'n' | b'r' | b't' | b'\\' | b'/' | b'"' => {
                        self.state = State::InString
                    }
                    b'u' => self.state = State::InStringUnicode(4),
                    _ => return Err(syntax_error(c, "in string escape code")),
                }
                Ok(Step::More)
            }
            State::InStringUnicode(left) => {
                if !c.is_ascii_hexdigit() {
                    return Err(syntax_error(c, "in \\u hexadecimal character escape"));
                }
                self.state = if left == 1 {
                    State::InString
                } else {
                    State::InStringUnicode(left - 1)
                };
                Ok(Step::More)
            }
            State::Minus => match c {
                b'0' => self.to(State::Zero),
                b'1'..=b'9' => self.to(State::Digits),
                _ => Err(syntax_error(c, "in numeric literal")),
            },
            State::Zero => match c {
                b'.' => self.to(State::Dot),
                b'e' | b'E' => self.to(State::Exponent),
                _ => self.end_value(c),
            },
            State::Digits => match c {
                b'0'..=b'9' => Ok(Step::More),
                b'.' => self.to(State::Dot),
                b'e' | b'E' => self.to(State::Exponent),
                _ => self.end_value(c),
            },
            State::Dot => match c {
                b'0'..=b'9' => self.to(State::Fraction),
                _ => Err(syntax_error(c, "after decimal point in numeric literal")),
            },
            State::Fraction => match c {
                b'0'..=b'9' => Ok(Step::More),
                b'e' | b'E' => self.to(State::Exponent),
                _ => self.end_value(c),
            },
            State::Exponent => match c {
                b'+' | b'-' => self.to(State::ExponentSign),
                b'0'..=b'9' => self.to(State::ExponentDigits),
                _ => Err(syntax_error(c, "in exponent of numeric literal")),
            },
            State::ExponentSign => match c {
                b'0'..=b'9' => self.to(State::ExponentDigits),
                _ => Err(syntax_error(c, "in exponent of numeric literal")),
            },
            State::ExponentDigits => match c {
                b'0'..=b'9' => Ok(Step::More),
                _ => self.end_value(c),
            },
            State::Literal { word, at } => {
                let expected = word.as_bytes()[usize::from(at)];
                if c != expected {
                    return Err(syntax_error(
                        c,
                        &format!("in literal {word} (expecting {})", quote_char(expected)),
                    ));
                }
                if usize::from(at) + 1 == word.len() {
                    self.state = State::EndValue;
                    if self.stack.is_empty() {
                        self.state = State::Done;
                        return Ok(Step::EndedWith);
                    }
                } else {
                    self.state = State::Literal { word, at: at + 1 };
                }
                Ok(Step::More)
            }
            State::EndValue => self.end_value(c),
        }
    }

    fn to(&mut self, state: State) -> Result<Step, String> {
        self.state = state;
        Ok(Step::More)
    }

    fn begin_value(&mut self, c: u8, close: bool) -> Result<Step, String> {
        match c {
            c if is_space(c) => Ok(Step::More),
            b'{' | b'[' => {
                if self.stack.len() >= MAX_DEPTH {
                    return Err("exceeded max depth".to_owned());
                }
                if c == b'{' {
                    self.stack.push(Frame::ObjectKey);
                    self.state = State::BeginKey { close: true };
                } else {
                    self.stack.push(Frame::ArrayValue);
                    self.state = State::BeginValue { close: true };
                }
                Ok(Step::More)
            }
            b'"' => self.to(State::InString),
            b'-' => self.to(State::Minus),
            b'0' => self.to(State::Zero),
            b'1'..=b'9' => self.to(State::Digits),
            b't' => self.to(State::Literal {
                word: "true",
                at: 1,
            }),
            b'f' => self.to(State::Literal {
                word: "false",
                at: 1,
            }),
            b'n' => self.to(State::Literal {
                word: "null",
                at: 1,
            }),
            b']' if close => self.end_value(c),
            _ => Err(syntax_error(c, "looking for beginning of value")),
        }
    }

    /// A value just ended (or `c` is what follows one): what the container makes of `c`.
    fn end_value(&mut self, c: u8) -> Result<Step, String> {
        let Some(top) = self.stack.last().copied() else {
            // The top-level value (a number, or a string whose closing quote came last) ended
            // before `c`; closing brackets and literals' last letters end it in their own arms.
            self.state = State::Done;
            return Ok(Step::EndedBefore);
        };
        self.state = State::EndValue;
        if is_space(c) {
            return Ok(Step::More);
        }
        match (top, c) {
            (Frame::ObjectKey, b':') => {
                self.replace_top(Frame::ObjectValue);
                self.to(State::BeginValue { close: false })
            }
            (Frame::ObjectKey, _) => Err(syntax_error(c, "after object key")),
            (Frame::ObjectValue, b',') => {
                self.replace_top(Frame::ObjectKey);
                self.to(State::BeginKey { close: false })
            }
            (Frame::ArrayValue, b',') => self.to(State::BeginValue { close: false }),
            (Frame::ObjectValue, b'}') | (Frame::ArrayValue, b']') => {
                self.stack.pop();
                if self.stack.is_empty() {
                    self.state = State::Done;
                    Ok(Step::EndedWith)
                } else {
                    Ok(Step::More)
                }
            }
            (Frame::ObjectValue, _) => Err(syntax_error(c, "after object key:value pair")),
            (Frame::ArrayValue, _) => Err(syntax_error(c, "after array element")),
        }
    }

    fn replace_top(&mut self, frame: Frame) {
        if let Some(top) = self.stack.last_mut() {
            *top = frame;
        }
    }

    /// The input ended. `Ok(true)`: a value is complete; `Ok(false)`: nothing but whitespace
    /// was seen; `Err(())`: a value was cut short.
    pub fn finish(&mut self) -> Result<bool, ()> {
        match self.state {
            State::Done => Ok(true),
            State::Zero | State::Digits | State::Fraction | State::ExponentDigits
                if self.stack.is_empty() =>
            {
                self.state = State::Done;
                Ok(true)
            }
            State::EndValue if self.stack.is_empty() => {
                self.state = State::Done;
                Ok(true)
            }
            _ if !self.started => Ok(false),
            _ => Err(()),
        }
    }

    /// Ready for the next value.
    pub fn reset(&mut self) {
        *self = Scanner::default();
    }
}

/// `json.Unmarshal`'s reading of a whole input: exactly one value and whitespace around it.
pub fn parse(input: &[u8]) -> Result<Json, String> {
    let mut scanner = Scanner::default();
    let mut end = None;
    for (i, &c) in input.iter().enumerate() {
        match scanner.step(c)? {
            Step::More => {}
            Step::EndedWith => {
                end = Some(i + 1);
                break;
            }
            Step::EndedBefore => {
                end = Some(i);
                break;
            }
        }
    }
    let end = match end {
        Some(end) => end,
        None => match scanner.finish() {
            Ok(true) => input.len(),
            _ => return Err("unexpected end of JSON input".to_owned()),
        },
    };
    if let Some(&c) = input[end..].iter().find(|c| !is_space(**c)) {
        return Err(syntax_error(c, "after top-level value"));
    }
    tree(&input[..end])
}

/// The tree of one value that the scanner accepted.
pub fn tree(input: &[u8]) -> Result<Json, String> {
    let mut reader = TreeReader { input, at: 0 };
    let value = reader.value()?;
    Ok(value)
}

/// A container [`TreeReader::value`] is inside of: the items so far, or the members so far and
/// the key of the value being read.
enum Open {
    Array(Vec<Json>),
    Object(Vec<(String, Json)>, String),
}

/// Builds a [`Json`] from input that [`Scanner`] has already checked; any surprise is an
/// error rather than a panic.
struct TreeReader<'a> {
    input: &'a [u8],
    at: usize,
}

fn malformed() -> String {
    "unexpected end of JSON input".to_owned()
}

impl TreeReader<'_> {
    fn skip_space(&mut self) {
        while self.input.get(self.at).is_some_and(|c| is_space(*c)) {
            self.at += 1;
        }
    }

    fn peek(&mut self) -> Result<u8, String> {
        self.skip_space();
        self.input.get(self.at).copied().ok_or_else(malformed)
    }

    fn expect(&mut self, c: u8) -> Result<(), String> {
        if self.peek()? != c {
            return Err(malformed());
        }
        self.at += 1;
        Ok(())
    }

    /// One value, read with a stack of open containers rather than recursion: the scanner
    /// admits 10,000 levels (Go's limit, on goroutine stacks that grow), more than a
    /// recursive reader's frames fit in a tokio worker's 2 MiB stack.
    fn value(&mut self) -> Result<Json, String> {
        let mut open: Vec<Open> = Vec::new();
        loop {
            let mut done = match self.peek()? {
                b'{' => {
                    self.at += 1;
                    if self.peek()? == b'}' {
                        self.at += 1;
                        Json::Object(Vec::new())
                    } else {
                        let key = self.member_key()?;
                        open.push(Open::Object(Vec::new(), key));
                        continue;
                    }
                }
                b'[' => {
                    self.at += 1;
                    if self.peek()? == b']' {
                        self.at += 1;
                        Json::Array(Vec::new())
                    } else {
                        open.push(Open::Array(Vec::new()));
                        continue;
                    }
                }
                _ => self.scalar()?,
            };
            // Put the finished value into its container, closing every container it ends.
            loop {
                let close = match open.last_mut() {
                    None => return Ok(done),
                    Some(Open::Array(items)) => {
                        items.push(done);
                        match self.peek()? {
                            b',' => {
                                self.at += 1;
                                break;
                            }
                            b']' => b']',
                            _ => return Err(malformed()),
                        }
                    }
                    Some(Open::Object(members, key)) => {
                        members.push((std::mem::take(key), done));
                        match self.peek()? {
                            b',' => {
                                self.at += 1;
                                *key = self.member_key()?;
                                break;
                            }
                            b'}' => b'}',
                            _ => return Err(malformed()),
                        }
                    }
                };
                self.at += 1;
                done = match (open.pop(), close) {
                    (Some(Open::Array(items)), b']') => Json::Array(items),
                    (Some(Open::Object(members, _)), b'}') => Json::Object(members),
                    _ => return Err(malformed()),
                };
            }
        }
    }

    /// An object member's key and the colon after it.
    fn member_key(&mut self) -> Result<String, String> {
        let (key, _) = self.string()?;
        self.expect(b':')?;
        Ok(key)
    }

    /// A string, literal or number.
    fn scalar(&mut self) -> Result<Json, String> {
        match self.peek()? {
            b'"' => {
                let (value, raw) = self.string()?;
                Ok(Json::String { value, raw })
            }
            b't' => self.word("true", Json::Bool(true)),
            b'f' => self.word("false", Json::Bool(false)),
            b'n' => self.word("null", Json::Null),
            _ => {
                let start = self.at;
                while self
                    .input
                    .get(self.at)
                    .is_some_and(|c| matches!(c, b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E'))
                {
                    self.at += 1;
                }
                if start == self.at {
                    return Err(malformed());
                }
                let text =
                    std::str::from_utf8(&self.input[start..self.at]).map_err(|_| malformed())?;
                Ok(Json::Number(text.to_owned()))
            }
        }
    }

    fn word(&mut self, word: &str, value: Json) -> Result<Json, String> {
        if !self.input[self.at..].starts_with(word.as_bytes()) {
            return Err(malformed());
        }
        self.at += word.len();
        Ok(value)
    }

    /// A string at the cursor: its value, unescaped as Go does (invalid UTF-8 and lone
    /// surrogates become U+FFFD), and its source text with the quotes.
    fn string(&mut self) -> Result<(String, String), String> {
        self.expect(b'"')?;
        let start = self.at - 1;
        let mut bytes = Vec::new();
        loop {
            let c = *self.input.get(self.at).ok_or_else(malformed)?;
            self.at += 1;
            match c {
                b'"' => break,
                b'\\' => {
                    let e = *self.input.get(self.at).ok_or_else(malformed)?;
                    self.at += 1;
                    let ch = match e {
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => self.unicode_escape()?,
                        other => char::from(other),
                    };
                    let mut buf = [0; 4];
                    bytes.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
                }
                _ => bytes.push(c),
            }
        }
        let raw = String::from_utf8_lossy(&self.input[start..self.at]).into_owned();
        Ok((String::from_utf8_lossy(&bytes).into_owned(), raw))
    }

    fn hex4(&mut self) -> Option<u32> {
        let digits = self.input.get(self.at..self.at + 4)?;
        let text = std::str::from_utf8(digits).ok()?;
        let value = u32::from_str_radix(text, 16).ok()?;
        self.at += 4;
        Some(value)
    }

    /// The character of a `\u` escape (the `\u` read), joining a surrogate pair.
    fn unicode_escape(&mut self) -> Result<char, String> {
        let first = self.hex4().ok_or_else(malformed)?;
        if (0xd800..0xdc00).contains(&first)
            && self.input.get(self.at..self.at + 2) == Some(b"\\u".as_slice())
        {
            let saved = self.at;
            self.at += 2;
            if let Some(second) = self.hex4()
                && (0xdc00..0xe000).contains(&second)
            {
                let code = 0x10000 + ((first - 0xd800) << 10) + (second - 0xdc00);
                return Ok(char::from_u32(code).unwrap_or('\u{fffd}'));
            }
            self.at = saved;
        }
        Ok(char::from_u32(first).unwrap_or('\u{fffd}'))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(input: &str) -> String {
        parse(input.as_bytes()).expect_err(input)
    }

    #[test]
    fn syntax_errors_read_as_go_writes_them() {
        // Each text is what etcd 3.4's gateway answered for the same body.
        assert_eq!(
            err(r#"{"key":"Zm9v",}"#),
            "invalid character '}' looking for beginning of object key string"
        );
        assert_eq!(
            err(r#"{"key" "Zm9v"}"#),
            "invalid character '\"' after object key"
        );
        assert_eq!(
            err("{key:1}"),
            "invalid character 'k' looking for beginning of object key string"
        );
        assert_eq!(
            err(r#"{"key":tru}"#),
            "invalid character '}' in literal true (expecting 'e')"
        );
        assert_eq!(
            err(r#"{"key":01}"#),
            "invalid character '1' after object key:value pair"
        );
        assert_eq!(
            err(r#"{"key":-}"#),
            "invalid character '}' in numeric literal"
        );
        assert_eq!(
            err(r#"{"key":1.}"#),
            "invalid character '}' after decimal point in numeric literal"
        );
        assert_eq!(
            err(r#"{"key":1e}"#),
            "invalid character '}' in exponent of numeric literal"
        );
        assert_eq!(
            err(r#"{"key":"a\qb"}"#),
            "invalid character 'q' in string escape code"
        );
        assert_eq!(
            err("{\"key\":\"a\tb\"}"),
            r"invalid character '\t' in string literal"
        );
        assert_eq!(
            err(r"\u0031"),
            r"invalid character '\\' looking for beginning of value"
        );
        assert_eq!(
            err("abc"),
            "invalid character 'a' looking for beginning of value"
        );
        assert_eq!(
            err("[1,]"),
            "invalid character ']' looking for beginning of value"
        );
        assert_eq!(err("[1 2]"), "invalid character '2' after array element");
        assert_eq!(err("1 2"), "invalid character '2' after top-level value");
        assert_eq!(err(""), "unexpected end of JSON input");
        assert_eq!(err(r#"{"a":"#), "unexpected end of JSON input");
    }

    #[test]
    fn values_parse_with_their_source_text() {
        assert_eq!(
            parse(br#" {"a":[1,-2.5e3,true,null],"b":"x\u00e9\"","a":{}} "#),
            Ok(Json::Object(vec![
                (
                    "a".into(),
                    Json::Array(vec![
                        Json::Number("1".into()),
                        Json::Number("-2.5e3".into()),
                        Json::Bool(true),
                        Json::Null
                    ])
                ),
                (
                    "b".into(),
                    Json::String {
                        value: "xé\"".into(),
                        raw: r#""x\u00e9\"""#.into()
                    }
                ),
                ("a".into(), Json::Object(vec![])),
            ]))
        );
        assert_eq!(parse(b"12"), Ok(Json::Number("12".into())));
        assert_eq!(
            parse(br#""\ud83d\ude00""#)
                .map(|j| matches!(j, Json::String { ref value, .. } if value == "😀")),
            Ok(true)
        );
    }

    #[test]
    fn a_scanner_fed_in_pieces_finds_where_each_value_ends() {
        let input = br#" {"a":[1,2]}7 "x" "#;
        let mut scanner = Scanner::default();
        let mut ends = Vec::new();
        let mut i = 0;
        while i < input.len() {
            match scanner.step(input[i]).expect("valid") {
                Step::More => i += 1,
                Step::EndedWith => {
                    ends.push(i + 1);
                    scanner.reset();
                    i += 1;
                }
                Step::EndedBefore => {
                    ends.push(i);
                    scanner.reset();
                }
            }
        }
        assert_eq!(ends, [12, 13, 17]);
        assert_eq!(scanner.finish(), Ok(false));
        let mut cut = Scanner::default();
        for c in br#"{"a":"#.iter() {
            cut.step(*c).expect("valid so far");
        }
        assert_eq!(cut.finish(), Err(()));
    }
}
