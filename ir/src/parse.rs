//! Reads the canonical text form back into a module. `print_module(parse_module(text)) == text`
//! for every printed module; the parser never panics on any input.

use std::collections::{BTreeMap, HashMap};

use crate::graph::{Function, Module, Shard, Value};
use crate::lit::Lit;
use crate::ops::Op;
use crate::{DType, Dim, TensorType};

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{line}:{col}: {message}")]
pub struct ParseError {
    pub line: usize,
    pub col: usize,
    pub message: String,
}

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Ident(String),
    Int(i128),
    Float(f64),
    Str(String),
    /// `%N` or `%N#k`.
    Ref(u64, u32),
    Punct(char),
    Eof,
}

struct Lexer<'a> {
    src: &'a str,
    pos: usize,
    line: usize,
    col: usize,
}

impl<'a> Lexer<'a> {
    fn err(&self, message: impl Into<String>) -> ParseError {
        ParseError {
            line: self.line,
            col: self.col,
            message: message.into(),
        }
    }

    fn peek_char(&self) -> Option<char> {
        self.src[self.pos..].chars().next()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek_char()?;
        self.pos += c.len_utf8();
        if c == '\n' {
            self.line += 1;
            self.col = 1;
        } else {
            self.col += 1;
        }
        Some(c)
    }

    fn skip_trivia(&mut self) {
        loop {
            match self.peek_char() {
                Some(c) if c.is_whitespace() => {
                    self.bump();
                }
                Some('/') if self.src[self.pos..].starts_with("//") => {
                    while !matches!(self.peek_char(), None | Some('\n')) {
                        self.bump();
                    }
                }
                _ => return,
            }
        }
    }

    fn take_while(&mut self, f: impl Fn(char) -> bool) -> &'a str {
        let start = self.pos;
        while self.peek_char().is_some_and(&f) {
            self.bump();
        }
        &self.src[start..self.pos]
    }

    /// The next token and the line and column it starts at.
    fn next(&mut self) -> Result<(Tok, usize, usize), ParseError> {
        self.skip_trivia();
        let (line, col) = (self.line, self.col);
        let Some(c) = self.peek_char() else {
            return Ok((Tok::Eof, line, col));
        };
        let tok = if c.is_ascii_alphabetic() || c == '_' {
            Tok::Ident(
                self.take_while(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
                    .to_string(),
            )
        } else if c.is_ascii_digit() || c == '-' {
            self.number()?
        } else if c == '"' {
            Tok::Str(self.string()?)
        } else if c == '%' {
            self.bump();
            let id = self.take_while(|c| c.is_ascii_digit());
            let id = id
                .parse()
                .map_err(|_| self.err("expected a value id after `%`"))?;
            let output = if self.peek_char() == Some('#') {
                self.bump();
                let k = self.take_while(|c| c.is_ascii_digit());
                k.parse()
                    .map_err(|_| self.err("expected an output number after `#`"))?
            } else {
                0
            };
            Tok::Ref(id, output)
        } else if "={}[](),:@".contains(c) {
            self.bump();
            Tok::Punct(c)
        } else {
            return Err(self.err(format!("unexpected character {c:?}")));
        };
        Ok((tok, line, col))
    }

    fn number(&mut self) -> Result<Tok, ParseError> {
        let (start, line, col) = (self.pos, self.line, self.col);
        let err = |message: String| ParseError { line, col, message };
        if self.peek_char() == Some('-') {
            self.bump();
        }
        self.take_while(|c| c.is_ascii_digit());
        let mut is_float = false;
        if self.peek_char() == Some('.') {
            is_float = true;
            self.bump();
            self.take_while(|c| c.is_ascii_digit());
        }
        if matches!(self.peek_char(), Some('e' | 'E')) {
            is_float = true;
            self.bump();
            if matches!(self.peek_char(), Some('+' | '-')) {
                self.bump();
            }
            self.take_while(|c| c.is_ascii_digit());
        }
        let text = &self.src[start..self.pos];
        if is_float {
            match text.parse::<f64>() {
                Ok(x) if x.is_finite() => Ok(Tok::Float(x)),
                Ok(_) => Err(err(format!("number `{text}` is out of range for f64"))),
                Err(_) => Err(err(format!("bad number `{text}`"))),
            }
        } else {
            text.parse()
                .map(Tok::Int)
                .map_err(|_| err(format!("bad number `{text}`")))
        }
    }

    fn string(&mut self) -> Result<String, ParseError> {
        self.bump();
        let mut s = String::new();
        loop {
            match self.bump() {
                None => return Err(self.err("unterminated string")),
                Some('"') => return Ok(s),
                Some('\\') => match self.bump() {
                    Some('"') => s.push('"'),
                    Some('\\') => s.push('\\'),
                    Some('n') => s.push('\n'),
                    Some('u') => {
                        if self.bump() != Some('{') {
                            return Err(self.err("expected `{` after `\\u`"));
                        }
                        let hex = self.take_while(|c| c.is_ascii_hexdigit());
                        let c = u32::from_str_radix(hex, 16).ok().and_then(char::from_u32);
                        let c = c.ok_or_else(|| self.err("bad `\\u{..}` escape"))?;
                        if self.bump() != Some('}') {
                            return Err(self.err("expected `}` to close `\\u{..}`"));
                        }
                        s.push(c);
                    }
                    _ => return Err(self.err("unknown escape in string")),
                },
                Some(c) => s.push(c),
            }
        }
    }
}

/// How deeply attribute values (lists, recipe calls) may nest; the parser recurses on them.
const MAX_NESTING: usize = 64;

struct Parser<'a> {
    lex: Lexer<'a>,
    tok: Tok,
    line: usize,
    col: usize,
    depth: usize,
}

impl<'a> Parser<'a> {
    fn new(src: &'a str) -> Result<Parser<'a>, ParseError> {
        let mut lex = Lexer {
            src,
            pos: 0,
            line: 1,
            col: 1,
        };
        let (tok, line, col) = lex.next()?;
        Ok(Parser {
            lex,
            tok,
            line,
            col,
            depth: 0,
        })
    }

    fn err(&self, message: impl Into<String>) -> ParseError {
        ParseError {
            line: self.line,
            col: self.col,
            message: message.into(),
        }
    }

    fn advance(&mut self) -> Result<Tok, ParseError> {
        let (tok, line, col) = self.lex.next()?;
        self.line = line;
        self.col = col;
        Ok(std::mem::replace(&mut self.tok, tok))
    }

    fn describe(&self) -> String {
        match &self.tok {
            Tok::Ident(s) => format!("`{s}`"),
            Tok::Int(n) => format!("`{n}`"),
            Tok::Float(x) => format!("`{x:?}`"),
            Tok::Str(s) => format!("{s:?}"),
            Tok::Ref(id, _) => format!("`%{id}`"),
            Tok::Punct(c) => format!("`{c}`"),
            Tok::Eof => "the end of the text".into(),
        }
    }

    fn expect_punct(&mut self, c: char) -> Result<(), ParseError> {
        if self.tok == Tok::Punct(c) {
            self.advance()?;
            Ok(())
        } else {
            Err(self.err(format!("expected `{c}`, found {}", self.describe())))
        }
    }

    fn eat_punct(&mut self, c: char) -> Result<bool, ParseError> {
        if self.tok == Tok::Punct(c) {
            self.advance()?;
            Ok(true)
        } else {
            Ok(false)
        }
    }

    fn expect_keyword(&mut self, kw: &str) -> Result<(), ParseError> {
        if self.tok == Tok::Ident(kw.to_string()) {
            self.advance()?;
            Ok(())
        } else {
            Err(self.err(format!("expected `{kw}`, found {}", self.describe())))
        }
    }

    fn ident(&mut self, what: &str) -> Result<String, ParseError> {
        match &self.tok {
            Tok::Ident(_) => match self.advance()? {
                Tok::Ident(s) => Ok(s),
                _ => unreachable!("checked above"),
            },
            _ => Err(self.err(format!("expected {what}, found {}", self.describe()))),
        }
    }

    fn string(&mut self, what: &str) -> Result<String, ParseError> {
        match &self.tok {
            Tok::Str(_) => match self.advance()? {
                Tok::Str(s) => Ok(s),
                _ => unreachable!("checked above"),
            },
            _ => Err(self.err(format!(
                "expected {what} (a quoted string), found {}",
                self.describe()
            ))),
        }
    }

    /// `KEY=N` in the module header.
    fn header_int(&mut self, key: &str) -> Result<u64, ParseError> {
        self.expect_keyword(key)?;
        self.expect_punct('=')?;
        match self.tok {
            Tok::Int(n) if (0..=u64::MAX as i128).contains(&n) => {
                self.advance()?;
                Ok(n as u64)
            }
            _ => Err(self.err(format!(
                "expected a count after `{key}=`, found {}",
                self.describe()
            ))),
        }
    }

    fn module(&mut self) -> Result<Module, ParseError> {
        self.expect_keyword("glmc.module")?;
        let mut module = Module::new(self.string("the module name")?);
        if self.tok == Tok::Ident("tp".into()) {
            let at = self.err("");
            let degree = self.header_int("tp")?;
            let rank = self.header_int("rank")?;
            if degree < 2 || rank >= degree {
                return Err(ParseError {
                    message: format!(
                        "tp={degree} rank={rank}: a partitioned module has tp ≥ 2 and a rank below it"
                    ),
                    ..at
                });
            }
            module.tp = crate::graph::Tp { degree, rank };
        }
        while self.tok == Tok::Ident("state".into()) {
            self.advance()?;
            let twice = self.err("");
            let name = self.string("the state name")?;
            self.expect_punct(':')?;
            let row = self.tensor_type()?;
            if module.states.insert(name.clone(), row).is_some() {
                return Err(ParseError {
                    message: format!("state \"{name}\" is declared twice"),
                    ..twice
                });
            }
        }
        while self.tok != Tok::Eof {
            let f = self.function()?;
            module.functions.push(f);
        }
        Ok(module)
    }

    fn function(&mut self) -> Result<Function, ParseError> {
        self.expect_keyword("func")?;
        self.expect_punct('@')?;
        let mut f = Function::new(self.ident("a function name")?);
        self.expect_punct('{')?;
        let mut values: HashMap<u64, petgraph::stable_graph::NodeIndex> = HashMap::new();
        loop {
            match &self.tok {
                Tok::Ref(..) => self.node(&mut f, &mut values)?,
                Tok::Ident(k) if k == "return" => break,
                _ => {
                    return Err(self.err(format!(
                        "expected a node `%N = ...` or `return`, found {}",
                        self.describe()
                    )))
                }
            }
        }
        self.advance()?;
        if self.tok != Tok::Punct('}') {
            loop {
                let v = self.value_ref(&f, &values)?;
                let name = self.string("the result name")?;
                f.results.push((name, v));
                if !self.eat_punct(',')? {
                    break;
                }
            }
        }
        self.expect_punct('}')?;
        Ok(f)
    }

    fn value_ref(
        &mut self,
        f: &Function,
        values: &HashMap<u64, petgraph::stable_graph::NodeIndex>,
    ) -> Result<Value, ParseError> {
        let Tok::Ref(id, output) = self.tok else {
            return Err(self.err(format!("expected a value `%N`, found {}", self.describe())));
        };
        let node = *values
            .get(&id)
            .ok_or_else(|| self.err(format!("%{id} is used before it is defined")))?;
        if output as usize >= f.graph[node].outputs.len() {
            return Err(self.err(format!("%{id} has no output #{output}")));
        }
        self.advance()?;
        Ok(Value { node, output })
    }

    fn node(
        &mut self,
        f: &mut Function,
        values: &mut HashMap<u64, petgraph::stable_graph::NodeIndex>,
    ) -> Result<(), ParseError> {
        let Tok::Ref(id, 0) = self.tok else {
            return Err(self.err("a node is defined as `%N`, without `#`"));
        };
        if values.contains_key(&id) {
            return Err(self.err(format!("%{id} is defined twice")));
        }
        self.advance()?;
        self.expect_punct('=')?;
        let (op_line, op_col) = (self.line, self.col);
        let op_name = self.ident("an op name")?;
        let mut operands = Vec::new();
        if matches!(self.tok, Tok::Ref(..)) {
            loop {
                operands.push(self.value_ref(f, values)?);
                if !self.eat_punct(',')? {
                    break;
                }
            }
        }
        let mut attrs = BTreeMap::new();
        if self.eat_punct('{')? {
            loop {
                let key = self.ident("an attribute name")?;
                self.expect_punct('=')?;
                let value = self.lit()?;
                if attrs.insert(key.clone(), value).is_some() {
                    return Err(self.err(format!("attribute `{key}` is given twice")));
                }
                if !self.eat_punct(',')? {
                    break;
                }
            }
            self.expect_punct('}')?;
        }
        let op = Op::from_parts(&op_name, &attrs).map_err(|message| ParseError {
            line: op_line,
            col: op_col,
            message,
        })?;
        self.expect_punct(':')?;
        let mut outputs = Vec::new();
        if self.eat_punct('(')? {
            loop {
                outputs.push(self.tensor_type()?);
                if !self.eat_punct(',')? {
                    break;
                }
            }
            self.expect_punct(')')?;
        } else {
            outputs.push(self.tensor_type()?);
        }
        let name = self.string("the node name")?;
        let shard = self.shard()?;
        let n = f.add_node(op, name, &operands, outputs);
        f.graph[n].shard = shard;
        values.insert(id, n);
        Ok(())
    }

    /// A node's optional ` tp=split(AXIS)`, ` tp=stacked(AXIS, PARTS)` or ` tp=partial` after
    /// its name.
    fn shard(&mut self) -> Result<Option<Shard>, ParseError> {
        if self.tok != Tok::Ident("tp".into()) {
            return Ok(None);
        }
        self.advance()?;
        self.expect_punct('=')?;
        let here = self.err("");
        match self.ident("`split`, `stacked` or `partial`")?.as_str() {
            "partial" => Ok(Some(Shard::Partial)),
            "split" => {
                self.expect_punct('(')?;
                let axis = self.shard_number("the split axis")?;
                self.expect_punct(')')?;
                Ok(Some(Shard::Split { axis }))
            }
            "stacked" => {
                self.expect_punct('(')?;
                let axis = self.shard_number("the stacked axis")?;
                self.expect_punct(',')?;
                let parts = self.shard_number("the number of stacked parts")?;
                self.expect_punct(')')?;
                Ok(Some(Shard::Stacked { axis, parts }))
            }
            other => Err(ParseError {
                message: format!(
                    "tp={other}: a node's tp is `split(AXIS)`, `stacked(AXIS, PARTS)` or `partial`"
                ),
                ..here
            }),
        }
    }

    fn shard_number(&mut self, what: &str) -> Result<u32, ParseError> {
        let n = match self.tok {
            Tok::Int(n) if (0..=u32::MAX as i128).contains(&n) => n as u32,
            _ => return Err(self.err(format!("expected {what}, found {}", self.describe()))),
        };
        self.advance()?;
        Ok(n)
    }

    fn tensor_type(&mut self) -> Result<TensorType, ParseError> {
        let (line, col) = (self.line, self.col);
        let dt = self.ident("a dtype")?;
        let dtype = DType::from_name(&dt).ok_or_else(|| ParseError {
            line,
            col,
            message: format!("unknown dtype `{dt}` (f32, bf16, f16, f8e4m3, i32, i64)"),
        })?;
        self.expect_punct('[')?;
        let mut shape = Vec::new();
        if !self.eat_punct(']')? {
            loop {
                let here = self.err("expected a dimension (a number or a symbol)");
                shape.push(match self.advance()? {
                    Tok::Int(n) if n >= 0 && n <= u64::MAX as i128 => Dim::Const(n as u64),
                    Tok::Ident(s) => Dim::Sym(s),
                    _ => return Err(here),
                });
                if !self.eat_punct(',')? {
                    break;
                }
            }
            self.expect_punct(']')?;
        }
        Ok(TensorType::new(dtype, shape))
    }

    fn lit(&mut self) -> Result<Lit, ParseError> {
        if self.depth >= MAX_NESTING {
            return Err(self.err(format!(
                "attribute value nested deeper than {MAX_NESTING} levels"
            )));
        }
        self.depth += 1;
        let lit = self.lit_unnested();
        self.depth -= 1;
        lit
    }

    fn lit_unnested(&mut self) -> Result<Lit, ParseError> {
        let here = self.err("expected an attribute value");
        match self.advance()? {
            Tok::Int(n) => Ok(Lit::Int(n)),
            Tok::Float(x) => Ok(Lit::Float(x)),
            Tok::Str(s) => Ok(Lit::Str(s)),
            Tok::Ident(name) => {
                if self.eat_punct('(')? {
                    let args = self.lit_items(')')?;
                    Ok(Lit::Call(name, args))
                } else {
                    Ok(Lit::Ident(name))
                }
            }
            Tok::Punct('[') => Ok(Lit::List(self.lit_items(']')?)),
            _ => Err(here),
        }
    }

    fn lit_items(&mut self, close: char) -> Result<Vec<Lit>, ParseError> {
        let mut items = Vec::new();
        if self.eat_punct(close)? {
            return Ok(items);
        }
        loop {
            items.push(self.lit()?);
            if !self.eat_punct(',')? {
                break;
            }
        }
        self.expect_punct(close)?;
        Ok(items)
    }
}

pub fn parse_module(text: &str) -> Result<Module, ParseError> {
    let mut p = Parser::new(text)?;
    p.module()
}
