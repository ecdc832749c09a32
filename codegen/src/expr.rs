//! Sizes that depend on the symbols bound at run time (`s` new tokens, `t` context, `b` batch):
//! polynomials with integer coefficients, so offsets, strides and element counts of views stay
//! exact and symbolic in the schedule, and the runtime evaluates them once per launch.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use glmc_ir::Dim;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

pub use glmc_passes::plan_memory::{decode_bindings, prefill_bindings, Bindings};

/// `Σ coef · Π symbols`, kept normalised (no zero terms, symbols of a term sorted), so two equal
/// polynomials compare equal. It is written as text in the manifest (`2*s*t + 64`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Poly {
    terms: BTreeMap<Vec<String>, i64>,
}

impl Poly {
    pub fn zero() -> Poly {
        Poly::default()
    }

    pub fn constant(c: i64) -> Poly {
        let mut p = Poly::zero();
        if c != 0 {
            p.terms.insert(Vec::new(), c);
        }
        p
    }

    pub fn sym(name: &str) -> Poly {
        Poly {
            terms: BTreeMap::from([(vec![name.to_string()], 1)]),
        }
    }

    pub fn from_dim(d: &Dim) -> Poly {
        match d {
            Dim::Const(c) => Poly::constant(*c as i64),
            Dim::Sym(s) => Poly::sym(s),
        }
    }

    /// The product of `dims`: the element count of a shape.
    pub fn product<'a>(dims: impl IntoIterator<Item = &'a Poly>) -> Poly {
        dims.into_iter()
            .fold(Poly::constant(1), |acc, d| acc.mul(d))
    }

    pub fn as_const(&self) -> Option<i64> {
        match self.terms.len() {
            0 => Some(0),
            1 => self.terms.get(&Vec::new()).copied(),
            _ => None,
        }
    }

    pub fn add(&self, other: &Poly) -> Poly {
        let mut out = self.clone();
        for (m, c) in &other.terms {
            let e = out.terms.entry(m.clone()).or_insert(0);
            *e += c;
            if *e == 0 {
                out.terms.remove(m);
            }
        }
        out
    }

    pub fn mul(&self, other: &Poly) -> Poly {
        let mut out = Poly::zero();
        for (ma, ca) in &self.terms {
            for (mb, cb) in &other.terms {
                let mut m: Vec<String> = ma.iter().chain(mb).cloned().collect();
                m.sort();
                out = out.add(&Poly {
                    terms: BTreeMap::from([(m, ca * cb)]),
                });
            }
        }
        out
    }

    pub fn scale(&self, c: i64) -> Poly {
        self.mul(&Poly::constant(c))
    }

    /// Whether every coefficient is a multiple of `k`, so the value is one for any binding.
    pub fn divisible_by(&self, k: i64) -> bool {
        self.terms.values().all(|c| c % k == 0)
    }

    /// The symbols it mentions.
    pub fn symbols(&self) -> impl Iterator<Item = &str> {
        self.terms.keys().flatten().map(String::as_str)
    }

    /// Its value under `bindings`; `None` when a symbol is unbound or the value leaves i64.
    pub fn eval(&self, bindings: &Bindings) -> Option<i64> {
        let mut total: i64 = 0;
        for (m, c) in &self.terms {
            let mut v = *c;
            for s in m {
                v = v.checked_mul(i64::try_from(*bindings.get(s)?).ok()?)?;
            }
            total = total.checked_add(v)?;
        }
        Some(total)
    }
}

impl fmt::Display for Poly {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.terms.is_empty() {
            return f.write_str("0");
        }
        // Highest degree first, so `2*s*t + 64` reads the way it would be written by hand.
        let mut terms: Vec<(&Vec<String>, &i64)> = self.terms.iter().collect();
        terms.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.0.cmp(b.0)));
        for (i, (m, &c)) in terms.into_iter().enumerate() {
            let (sign, mag) = if c < 0 { ("-", -c) } else { ("+", c) };
            match (i, sign) {
                (0, "-") => f.write_str("-")?,
                (0, _) => {}
                _ => write!(f, " {sign} ")?,
            }
            let mut parts: Vec<String> = Vec::new();
            if mag != 1 || m.is_empty() {
                parts.push(mag.to_string());
            }
            parts.extend(m.iter().cloned());
            f.write_str(&parts.join("*"))?;
        }
        Ok(())
    }
}

/// A polynomial that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{text}` is not a size expression like `2*s*t + 64`: {why}")]
pub struct PolyParseError {
    pub text: String,
    pub why: String,
}

impl FromStr for Poly {
    type Err = PolyParseError;

    fn from_str(text: &str) -> Result<Poly, PolyParseError> {
        let err = |why: &str| PolyParseError {
            text: text.to_string(),
            why: why.to_string(),
        };
        let compact: String = text.chars().filter(|c| !c.is_whitespace()).collect();
        if compact.is_empty() {
            return Err(err("it is empty"));
        }
        let mut out = Poly::zero();
        let mut rest = compact.as_str();
        let mut first = true;
        while !rest.is_empty() {
            let negative = if let Some(r) = rest.strip_prefix('-') {
                rest = r;
                true
            } else if let Some(r) = rest.strip_prefix('+') {
                if first {
                    return Err(err("it starts with `+`"));
                }
                rest = r;
                false
            } else if first {
                false
            } else {
                return Err(err("terms must be joined by `+` or `-`"));
            };
            first = false;
            let end = rest.find(['+', '-']).unwrap_or(rest.len());
            let (term_text, tail) = rest.split_at(end);
            rest = tail;
            let mut term = Poly::constant(if negative { -1 } else { 1 });
            for factor in term_text.split('*') {
                let f = if let Ok(c) = factor.parse::<i64>() {
                    Poly::constant(c)
                } else if !factor.is_empty()
                    && factor
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_')
                    && factor.starts_with(|c: char| c.is_ascii_alphabetic())
                {
                    Poly::sym(factor)
                } else {
                    return Err(err(&format!("`{factor}` is neither a number nor a symbol")));
                };
                term = term.mul(&f);
            }
            out = out.add(&term);
        }
        Ok(out)
    }
}

impl Serialize for Poly {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for Poly {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Poly, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// A grid dimension: `ceil(work / per_block)` blocks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GridDim {
    pub work: Poly,
    pub per_block: u64,
}

impl GridDim {
    pub fn fixed(n: u64) -> GridDim {
        GridDim {
            work: Poly::constant(n as i64),
            per_block: 1,
        }
    }

    /// One block per unit of `work` (a row, a token, a query and head).
    pub fn one_block_each(work: Poly) -> GridDim {
        GridDim { work, per_block: 1 }
    }

    pub fn eval(&self, bindings: &Bindings) -> Option<u64> {
        let work = u64::try_from(self.work.eval(bindings)?).ok()?;
        Some(work.div_ceil(self.per_block))
    }
}

impl fmt::Display for GridDim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.per_block, self.work.as_const()) {
            (1, _) => write!(f, "{}", self.work),
            (p, Some(c)) => write!(f, "{}", (c as u64).div_ceil(p)),
            (p, None) => write!(f, "ceil(({})/{p})", self.work),
        }
    }
}

/// The row counts a launch runs at when it is one of several alternatives for its node:
/// `above < rows ≤ at_most`, either bound left out where there is none.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Guard {
    pub rows: Poly,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub above: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_most: Option<i64>,
}

impl Guard {
    /// `rows ≤ at_most`.
    pub fn at_most(rows: Poly, at_most: i64) -> Guard {
        Guard {
            rows,
            above: None,
            at_most: Some(at_most),
        }
    }

    /// `rows > above`.
    pub fn above(rows: Poly, above: i64) -> Guard {
        Guard {
            rows,
            above: Some(above),
            at_most: None,
        }
    }

    /// Whether the launch runs under `bindings` (`None`: `rows` is not bound).
    pub fn holds(&self, bindings: &Bindings) -> Option<bool> {
        self.rows
            .eval(bindings)
            .map(|r| self.above.is_none_or(|a| r > a) && self.at_most.is_none_or(|m| r <= m))
    }

    /// The fewest rows the launch runs at.
    pub fn fewest_rows(&self) -> i64 {
        self.above.map_or(1, |a| a + 1)
    }
}

impl fmt::Display for Guard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.above, self.at_most) {
            (Some(a), Some(m)) => write!(f, "if {a} < {} ≤ {m}", self.rows),
            (Some(a), None) => write!(f, "if {} > {a}", self.rows),
            (None, Some(m)) => write!(f, "if {} ≤ {m}", self.rows),
            (None, None) => write!(f, "always"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bind(pairs: &[(&str, u64)]) -> Bindings {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    #[test]
    fn arithmetic_normalises() {
        let s = Poly::sym("s");
        let t = Poly::sym("t");
        let p = s.mul(&t).scale(2).add(&Poly::constant(64));
        assert_eq!(p.to_string(), "2*s*t + 64");
        assert_eq!(t.mul(&s), s.mul(&t));
        assert_eq!(p.add(&p.scale(-1)), Poly::zero());
        assert_eq!(p.eval(&bind(&[("s", 3), ("t", 5)])), Some(94));
        assert_eq!(p.eval(&bind(&[("s", 3)])), None);
    }

    #[test]
    fn text_round_trips() {
        for text in ["0", "7", "s", "-s + 3", "2*s*t + 64", "b*t - 1", "s*s"] {
            let p: Poly = text.parse().unwrap();
            assert_eq!(p.to_string(), text);
        }
        assert!("s +".parse::<Poly>().is_err());
        assert!("2**s".parse::<Poly>().is_err());
        assert!("".parse::<Poly>().is_err());
    }

    #[test]
    fn grid_rounds_up() {
        let g = GridDim {
            work: Poly::sym("s").scale(3),
            per_block: 4,
        };
        assert_eq!(g.eval(&bind(&[("s", 3)])), Some(3));
        assert_eq!(g.to_string(), "ceil((3*s)/4)");
        assert_eq!(GridDim::fixed(7).to_string(), "7");
    }

    #[test]
    fn guards_bound_the_rows_on_either_side() {
        let b = |n| bind(&[("b", n)]);
        let range = Guard {
            rows: Poly::sym("b"),
            above: Some(4),
            at_most: Some(8),
        };
        assert_eq!(range.to_string(), "if 4 < b ≤ 8");
        let runs: Vec<u64> = (1..12)
            .filter(|&n| range.holds(&b(n)) == Some(true))
            .collect();
        assert_eq!(runs, [5, 6, 7, 8]);
        assert_eq!(range.fewest_rows(), 5);
        let small = Guard::at_most(Poly::sym("b"), 16);
        assert_eq!(
            (small.to_string(), small.fewest_rows()),
            ("if b ≤ 16".into(), 1)
        );
        let large = Guard::above(Poly::sym("b"), 16);
        assert_eq!(large.to_string(), "if b > 16");
        assert_eq!(large.holds(&b(17)), Some(true));
        assert_eq!(large.holds(&bind(&[])), None);
    }
}
