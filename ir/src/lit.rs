//! Attribute literals: the one syntax every op attribute is printed in and parsed from.
//!
//! Typed attributes convert to and from `Lit` through `AttrValue`, so the op table needs no
//! per-op printing or parsing code and the two can never drift apart.

use std::fmt::Write;

use crate::{DType, Dim, Recipe};

#[derive(Clone, Debug, PartialEq)]
pub enum Lit {
    Int(i128),
    Float(f64),
    Str(String),
    Ident(String),
    List(Vec<Lit>),
    Call(String, Vec<Lit>),
}

impl Lit {
    pub fn write(&self, out: &mut String) {
        match self {
            Lit::Int(n) => write!(out, "{n}").unwrap(),
            // `{:?}` is the shortest text that parses back to the same f64, and always carries a
            // `.` or an exponent, so a float never reads back as an integer.
            Lit::Float(x) => write!(out, "{x:?}").unwrap(),
            Lit::Str(s) => write_quoted(out, s),
            Lit::Ident(s) => out.push_str(s),
            Lit::List(items) => {
                out.push('[');
                write_items(out, items);
                out.push(']');
            }
            Lit::Call(name, args) => {
                out.push_str(name);
                out.push('(');
                write_items(out, args);
                out.push(')');
            }
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            Lit::Int(_) => "an integer",
            Lit::Float(_) => "a float",
            Lit::Str(_) => "a string",
            Lit::Ident(_) => "an identifier",
            Lit::List(_) => "a list",
            Lit::Call(..) => "a call",
        }
    }
}

fn write_items(out: &mut String, items: &[Lit]) {
    for (i, l) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        l.write(out);
    }
}

/// Writes `s` as a double-quoted string with `"`, `\` and control characters escaped.
pub fn write_quoted(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c if c.is_control() => write!(out, "\\u{{{:x}}}", c as u32).unwrap(),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A typed attribute value.
pub trait AttrValue: Sized {
    fn to_lit(&self) -> Lit;
    fn from_lit(lit: &Lit) -> Result<Self, String>;
}

pub(crate) fn expected<T>(what: &str, got: &Lit) -> Result<T, String> {
    Err(format!("expected {what}, found {}", got.kind()))
}

impl AttrValue for u64 {
    fn to_lit(&self) -> Lit {
        Lit::Int(*self as i128)
    }
    fn from_lit(lit: &Lit) -> Result<Self, String> {
        match lit {
            Lit::Int(n) => {
                u64::try_from(*n).map_err(|_| format!("{n} is not a non-negative 64-bit integer"))
            }
            other => expected("a non-negative integer", other),
        }
    }
}

impl AttrValue for f64 {
    fn to_lit(&self) -> Lit {
        Lit::Float(*self)
    }
    fn from_lit(lit: &Lit) -> Result<Self, String> {
        match lit {
            Lit::Float(x) => Ok(*x),
            Lit::Int(n) => Ok(*n as f64),
            other => expected("a number", other),
        }
    }
}

impl AttrValue for bool {
    fn to_lit(&self) -> Lit {
        Lit::Ident(self.to_string())
    }
    fn from_lit(lit: &Lit) -> Result<Self, String> {
        match lit {
            Lit::Ident(s) if s == "true" => Ok(true),
            Lit::Ident(s) if s == "false" => Ok(false),
            other => expected("true or false", other),
        }
    }
}

impl AttrValue for String {
    fn to_lit(&self) -> Lit {
        Lit::Str(self.clone())
    }
    fn from_lit(lit: &Lit) -> Result<Self, String> {
        match lit {
            Lit::Str(s) => Ok(s.clone()),
            other => expected("a string", other),
        }
    }
}

impl AttrValue for DType {
    fn to_lit(&self) -> Lit {
        Lit::Ident(self.name().to_string())
    }
    fn from_lit(lit: &Lit) -> Result<Self, String> {
        match lit {
            Lit::Ident(s) => DType::from_name(s)
                .ok_or_else(|| format!("unknown dtype `{s}` (f32, bf16, f16, f8e4m3, i32, i64)")),
            other => expected("a dtype", other),
        }
    }
}

impl AttrValue for Dim {
    fn to_lit(&self) -> Lit {
        match self {
            Dim::Const(n) => Lit::Int(*n as i128),
            Dim::Sym(s) => Lit::Ident(s.clone()),
        }
    }
    fn from_lit(lit: &Lit) -> Result<Self, String> {
        match lit {
            Lit::Ident(s) => Ok(Dim::Sym(s.clone())),
            other => u64::from_lit(other).map(Dim::Const),
        }
    }
}

impl<T: AttrValue> AttrValue for Vec<T> {
    fn to_lit(&self) -> Lit {
        Lit::List(self.iter().map(T::to_lit).collect())
    }
    fn from_lit(lit: &Lit) -> Result<Self, String> {
        match lit {
            Lit::List(items) => items.iter().map(T::from_lit).collect(),
            other => expected("a list", other),
        }
    }
}

/// An optional attribute: `none`, or the value.
impl<T: AttrValue> AttrValue for Option<T> {
    fn to_lit(&self) -> Lit {
        match self {
            None => Lit::Ident("none".into()),
            Some(v) => v.to_lit(),
        }
    }
    fn from_lit(lit: &Lit) -> Result<Self, String> {
        match lit {
            Lit::Ident(s) if s == "none" => Ok(None),
            other => T::from_lit(other).map(Some),
        }
    }
}

impl AttrValue for Recipe {
    fn to_lit(&self) -> Lit {
        let call = |name: &str, args: Vec<Lit>| Lit::Call(name.to_string(), args);
        match self {
            Recipe::Tensor { name, shape } => call("hf", vec![name.to_lit(), shape.to_lit()]),
            Recipe::Stack {
                pattern,
                count,
                shape,
            } => call(
                "stack",
                vec![pattern.to_lit(), count.to_lit(), shape.to_lit()],
            ),
            Recipe::Slice {
                src,
                axis,
                start,
                end,
            } => call(
                "slice",
                vec![src.to_lit(), axis.to_lit(), start.to_lit(), end.to_lit()],
            ),
            Recipe::Concat { axis, parts } => call("concat", vec![axis.to_lit(), parts.to_lit()]),
            Recipe::Reshape { src, shape } => call("reshape", vec![src.to_lit(), shape.to_lit()]),
            Recipe::Transpose { src, perm } => call("transpose", vec![src.to_lit(), perm.to_lit()]),
        }
    }

    fn from_lit(lit: &Lit) -> Result<Self, String> {
        let Lit::Call(name, args) = lit else {
            return expected("a recipe such as hf(\"name\", [rows, cols])", lit);
        };
        let arity = |n: usize| -> Result<(), String> {
            if args.len() == n {
                Ok(())
            } else {
                Err(format!(
                    "recipe `{name}` takes {n} arguments, found {}",
                    args.len()
                ))
            }
        };
        let src = |l: &Lit| Recipe::from_lit(l).map(Box::new);
        match name.as_str() {
            "hf" => {
                arity(2)?;
                Ok(Recipe::Tensor {
                    name: String::from_lit(&args[0])?,
                    shape: Vec::from_lit(&args[1])?,
                })
            }
            "stack" => {
                arity(3)?;
                Ok(Recipe::Stack {
                    pattern: String::from_lit(&args[0])?,
                    count: u64::from_lit(&args[1])?,
                    shape: Vec::from_lit(&args[2])?,
                })
            }
            "slice" => {
                arity(4)?;
                Ok(Recipe::Slice {
                    src: src(&args[0])?,
                    axis: u64::from_lit(&args[1])?,
                    start: u64::from_lit(&args[2])?,
                    end: u64::from_lit(&args[3])?,
                })
            }
            "concat" => {
                arity(2)?;
                Ok(Recipe::Concat {
                    axis: u64::from_lit(&args[0])?,
                    parts: Vec::from_lit(&args[1])?,
                })
            }
            "reshape" => {
                arity(2)?;
                Ok(Recipe::Reshape {
                    src: src(&args[0])?,
                    shape: Vec::from_lit(&args[1])?,
                })
            }
            "transpose" => {
                arity(2)?;
                Ok(Recipe::Transpose {
                    src: src(&args[0])?,
                    perm: Vec::from_lit(&args[1])?,
                })
            }
            other => Err(format!(
                "unknown recipe `{other}` (hf, stack, slice, concat, reshape, transpose)"
            )),
        }
    }
}
