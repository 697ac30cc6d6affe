//! A program's message tags, kept apart from the library's own.

use udbtl_btl::Tag as BtlTag;

/// A message tag of a program: a number from 0 to [`Tag::MAX`] that a
/// receiver chooses messages by, as MPI programs use theirs.
///
/// The transport carries one byte of tag; its low half belongs to the
/// transport and to udbtl itself (barriers), and a program's tags map into
/// the upper half (the BTL's user range, [`btl::Tag::USR`](BtlTag::USR)
/// and up). So no tag a program can name reaches the library's callbacks,
/// or theirs its own.
///
/// ```
/// use udbtl::Tag;
///
/// const DATA: Tag = Tag::new(1);
/// assert_eq!(DATA.get(), 1);
/// assert!(Tag::try_from(200).is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tag(u8);

impl Tag {
    /// The highest tag a program can use.
    pub const MAX: u8 = u8::MAX - BtlTag::USR.0;
    /// How many tags a program can use.
    pub(crate) const COUNT: usize = Self::MAX as usize + 1;

    /// Tag `number`.
    ///
    /// # Panics
    /// If `number` is over [`Tag::MAX`]. In a `const` item, as tags are
    /// usually named, that is a compile error; for a number known only at
    /// run time, use [`Tag::try_from`].
    pub const fn new(number: u8) -> Self {
        assert!(number <= Self::MAX, "a udbtl tag is at most Tag::MAX (127)");
        Self(number)
    }

    /// The tag's number.
    pub const fn get(self) -> u8 {
        self.0
    }

    /// The tag the transport carries.
    pub(crate) const fn on_the_wire(self) -> BtlTag {
        BtlTag(BtlTag::USR.0 + self.0)
    }

    /// Every tag a program can use, in order.
    pub(crate) fn all() -> impl Iterator<Item = Self> {
        (0..=Self::MAX).map(Self)
    }
}

impl TryFrom<u8> for Tag {
    type Error = TagError;

    fn try_from(number: u8) -> Result<Self, TagError> {
        if number <= Self::MAX {
            Ok(Self(number))
        } else {
            Err(TagError { number })
        }
    }
}

impl std::fmt::Display for Tag {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "tag {}", self.0)
    }
}

/// A number over [`Tag::MAX`] was given as a tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("tag {number} is over the highest tag, {max}", max = Tag::MAX)]
pub struct TagError {
    number: u8,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn program_tags_map_onto_the_user_range_only() {
        assert_eq!(Tag::all().count(), Tag::COUNT);
        for tag in Tag::all() {
            assert!(tag.on_the_wire().0 >= BtlTag::USR.0);
        }
        assert_eq!(Tag::new(Tag::MAX).on_the_wire(), BtlTag(u8::MAX));
        assert_eq!(Tag::try_from(Tag::MAX + 1), Err(TagError { number: 128 }));
        assert_eq!(
            TagError { number: 200 }.to_string(),
            "tag 200 is over the highest tag, 127"
        );
    }
}
