//! Parameter kinds and value types: how a parameter's text is parsed, its
//! bounds checked and its value rendered back.

use super::PortSelector;

/// How a parameter's text is read and its bounds checked.
#[derive(Debug, Clone, Copy)]
pub(super) enum Kind {
    Int { min: u64, max: u64, style: IntStyle },
    Bool,
    Choice(&'static [&'static str]),
    Ports,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum IntStyle {
    Decimal,
    /// Rendered in hex: values that are conventionally written so.
    Hex,
    /// Accepts k/m/g suffixes and renders with the largest exact one.
    Size,
}

pub(super) const fn int(min: u64, max: u64) -> Kind {
    Kind::Int {
        min,
        max,
        style: IntStyle::Decimal,
    }
}

pub(super) const fn hex(min: u64, max: u64) -> Kind {
    Kind::Int {
        min,
        max,
        style: IntStyle::Hex,
    }
}

pub(super) const fn size(min: u64, max: u64) -> Kind {
    Kind::Int {
        min,
        max,
        style: IntStyle::Size,
    }
}

pub(super) const fn choice(names: &'static [&'static str]) -> Kind {
    Kind::Choice(names)
}

pub(super) const BOOL: Kind = Kind::Bool;
pub(super) const PORTS: Kind = Kind::Ports;

/// What type a parameter's values have, for a host that registers the
/// parameters in a typed variable system of its own (Open MPI's MCA
/// variables): it parses and shows them by this type, and hands udbtl the
/// value as text, which udbtl checks as it checks its environment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ValueType {
    /// An unsigned integer that fits 32 bits.
    Integer,
    /// A byte count (may exceed 32 bits).
    Size,
    /// `true` or `false`.
    Boolean,
    /// One of a fixed list of names.
    Choice(&'static [&'static str]),
    /// Free text, or a comma-separated list.
    Text,
}

impl Kind {
    pub(super) const fn value_type(&self) -> ValueType {
        match *self {
            Self::Int {
                style: IntStyle::Size,
                ..
            } => ValueType::Size,
            Self::Int { max, .. } if max <= u32::MAX as u64 => ValueType::Integer,
            Self::Int { .. } => ValueType::Size,
            Self::Bool => ValueType::Boolean,
            Self::Choice(names) => ValueType::Choice(names),
            Self::Ports => ValueType::Text,
        }
    }

    pub(super) fn syntax(&self) -> String {
        match *self {
            Self::Int { min, max, style } => {
                let what = match style {
                    IntStyle::Decimal | IntStyle::Hex => "integer",
                    IntStyle::Size => "size (k/m/g suffixes)",
                };
                format!(
                    "{what} {}..={}",
                    render_int(min, style),
                    render_int(max, style)
                )
            }
            Self::Bool => "bool (1/0, true/false, yes/no, on/off)".to_owned(),
            Self::Choice(names) => names.join("|"),
            Self::Ports => "dev[:port] or subnet,...".to_owned(),
        }
    }

    /// A kind that does not fit the field's type is a mistake in the table;
    /// it fails every value, so the defaults test catches it.
    pub(super) fn mismatch(&self) -> String {
        format!("parameter table error: kind {self:?} does not fit the parameter's type")
    }
}

/// A parameter's value type: how it is read from text, checked against its
/// kind, and rendered back.
pub(super) trait Value: Clone + Sized {
    /// Syntax only; `text` is trimmed and non-empty.
    fn from_text(text: &str, kind: &Kind) -> Result<Self, String>;
    /// Bounds, and the canonical form.
    fn validate(self, kind: &Kind) -> Result<Self, String>;
    fn render(&self, kind: &Kind) -> String;
}

fn parse_int(text: &str, style: IntStyle) -> Result<u64, String> {
    let (digits, shift) = match (style, text.as_bytes().last()) {
        (IntStyle::Size, Some(b'k' | b'K')) => (&text[..text.len() - 1], 10),
        (IntStyle::Size, Some(b'm' | b'M')) => (&text[..text.len() - 1], 20),
        (IntStyle::Size, Some(b'g' | b'G')) => (&text[..text.len() - 1], 30),
        _ => (text, 0),
    };
    let expected = || {
        let suffixes = if style == IntStyle::Size {
            ", optionally with a k, m or g suffix"
        } else {
            ""
        };
        format!("expected a non-negative integer (decimal or 0x hex{suffixes})")
    };
    let (digits, radix) = match digits
        .strip_prefix("0x")
        .or_else(|| digits.strip_prefix("0X"))
    {
        Some(hex) => (hex, 16),
        None => (digits, 10),
    };
    // from_str_radix accepts a leading '+', which no documented syntax has.
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return Err(expected());
    }
    let n = u64::from_str_radix(digits, radix).map_err(|_| "too large".to_owned())?;
    n.checked_mul(1 << shift)
        .ok_or_else(|| "too large".to_owned())
}

fn render_int(n: u64, style: IntStyle) -> String {
    match style {
        IntStyle::Decimal => n.to_string(),
        IntStyle::Hex => format!("{n:#010x}"),
        IntStyle::Size => [(30, 'G'), (20, 'M'), (10, 'K')]
            .iter()
            .find(|(shift, _)| n != 0 && n % (1 << shift) == 0)
            .map_or_else(
                || n.to_string(),
                |(shift, suffix)| format!("{}{suffix}", n >> shift),
            ),
    }
}

fn check_range(n: u64, kind: &Kind) -> Result<(), String> {
    match *kind {
        Kind::Int { min, max, style } if !(min..=max).contains(&n) => Err(format!(
            "{} is outside {}..={}",
            render_int(n, style),
            render_int(min, style),
            render_int(max, style)
        )),
        Kind::Int { .. } => Ok(()),
        _ => Err(kind.mismatch()),
    }
}

macro_rules! int_value {
    ($($ty:ty),*) => {$(
        impl Value for $ty {
            fn from_text(text: &str, kind: &Kind) -> Result<Self, String> {
                let Kind::Int { style, .. } = *kind else { return Err(kind.mismatch()) };
                let n = parse_int(text, style)?;
                check_range(n, kind)?;
                Self::try_from(n).map_err(|_| format!("{n} does not fit in {}", stringify!($ty)))
            }

            fn validate(self, kind: &Kind) -> Result<Self, String> {
                check_range(u64::try_from(self).unwrap_or(u64::MAX), kind)?;
                Ok(self)
            }

            fn render(&self, kind: &Kind) -> String {
                let style = match *kind {
                    Kind::Int { style, .. } => style,
                    _ => IntStyle::Decimal,
                };
                render_int(u64::try_from(*self).unwrap_or(u64::MAX), style)
            }
        }
    )*};
}
int_value!(u8, u16, u32, usize);

/// A boolean as every `BOOL` parameter reads it: `1`/`0`, `true`/`false`,
/// `yes`/`no`, `on`/`off`, any case, surrounding whitespace ignored.
///
/// # Errors
/// Any other text, the empty string included, with what is accepted.
pub fn parse_bool(text: &str) -> Result<bool, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        "" => Err("empty value; expected 1/0, true/false, yes/no or on/off".to_owned()),
        _ => Err("expected 1/0, true/false, yes/no or on/off".to_owned()),
    }
}

impl Value for bool {
    fn from_text(text: &str, kind: &Kind) -> Result<Self, String> {
        if !matches!(kind, Kind::Bool) {
            return Err(kind.mismatch());
        }
        parse_bool(text)
    }

    fn validate(self, kind: &Kind) -> Result<Self, String> {
        if matches!(kind, Kind::Bool) {
            Ok(self)
        } else {
            Err(kind.mismatch())
        }
    }

    fn render(&self, _: &Kind) -> String {
        self.to_string()
    }
}

impl Value for String {
    fn from_text(text: &str, _: &Kind) -> Result<Self, String> {
        Ok(text.to_owned())
    }

    fn validate(self, kind: &Kind) -> Result<Self, String> {
        match *kind {
            Kind::Choice(names) => {
                let lower = self.trim().to_ascii_lowercase();
                // A choice between "off", "on" and more also takes the
                // spellings of a boolean, so that a switch can grow a mode
                // without breaking the settings users have.
                let switch = || {
                    let on = parse_bool(&lower).ok()?;
                    let name = if on { "on" } else { "off" };
                    names.contains(&name).then(|| name.to_owned())
                };
                if names.contains(&lower.as_str()) {
                    Ok(lower)
                } else if let Some(name) = switch() {
                    Ok(name)
                } else {
                    Err(format!("expected one of {}", names.join(", ")))
                }
            }
            _ => Err(kind.mismatch()),
        }
    }

    fn render(&self, _: &Kind) -> String {
        self.clone()
    }
}

impl Value for Vec<PortSelector> {
    fn from_text(text: &str, kind: &Kind) -> Result<Self, String> {
        if !matches!(kind, Kind::Ports) {
            return Err(kind.mismatch());
        }
        PortSelector::parse_list(text).map_err(|e| e.to_string())
    }

    fn validate(self, kind: &Kind) -> Result<Self, String> {
        match kind {
            // An empty include list would silently select no port at all.
            Kind::Ports if self.is_empty() => Err("empty list".to_owned()),
            Kind::Ports => Ok(self),
            _ => Err(kind.mismatch()),
        }
    }

    fn render(&self, _: &Kind) -> String {
        self.iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(",")
    }
}
