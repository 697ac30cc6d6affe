//! A small generational arena for verbs resources.
//!
//! Providers keep their protection domains, queues and registrations in
//! [`Table`]s and hand out [`Handle`]s: plain indices with a generation, so that
//! a handle used after its resource was destroyed is caught as
//! [`FabricError::InvalidHandle`](crate::FabricError::InvalidHandle) instead of
//! silently naming a newer resource that reused the slot.

/// An index into a [`Table`], valid until the entry is removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Handle {
    index: u32,
    generation: u32,
}

impl Handle {
    /// The slot index. Stable for the life of the resource, so providers use it
    /// to derive keys (lkeys, QP numbers).
    pub const fn index(self) -> u32 {
        self.index
    }

    /// How many times the slot was reused before this handle was issued.
    pub const fn generation(self) -> u32 {
        self.generation
    }
}

#[derive(Debug)]
struct Slot<T> {
    generation: u32,
    value: Option<T>,
}

impl<T> Slot<T> {
    /// The value, if `handle` names this slot's current generation.
    fn alive_mut(&mut self, handle: Handle) -> Option<&mut T> {
        if self.generation == handle.generation {
            self.value.as_mut()
        } else {
            None
        }
    }
}

/// Generational storage with O(1) insert, lookup and removal.
#[derive(Debug)]
pub struct Table<T> {
    slots: Vec<Slot<T>>,
    free: Vec<u32>,
    len: usize,
}

impl<T> Default for Table<T> {
    fn default() -> Self {
        Self {
            slots: Vec::new(),
            free: Vec::new(),
            len: 0,
        }
    }
}

impl<T> Table<T> {
    /// Stores `value` and returns its handle.
    pub fn insert(&mut self, value: T) -> Handle {
        self.len += 1;
        if let Some(index) = self.free.pop() {
            if let Some(slot) = self.slots.get_mut(index as usize) {
                slot.value = Some(value);
                return Handle {
                    index,
                    generation: slot.generation,
                };
            }
        }
        let index = u32::try_from(self.slots.len()).unwrap_or(u32::MAX);
        self.slots.push(Slot {
            generation: 0,
            value: Some(value),
        });
        Handle {
            index,
            generation: 0,
        }
    }

    /// The entry named by `handle`, if it is still alive.
    pub fn get(&self, handle: Handle) -> Option<&T> {
        self.slots
            .get(handle.index as usize)
            .filter(|slot| slot.generation == handle.generation)
            .and_then(|slot| slot.value.as_ref())
    }

    /// The entry named by `handle`, mutably, if it is still alive.
    pub fn get_mut(&mut self, handle: Handle) -> Option<&mut T> {
        self.slots
            .get_mut(handle.index as usize)
            .filter(|slot| slot.generation == handle.generation)
            .and_then(|slot| slot.value.as_mut())
    }

    /// The two different entries named by `first` and `second`, mutably,
    /// if both are still alive.
    pub fn get_pair_mut(&mut self, first: Handle, second: Handle) -> Option<(&mut T, &mut T)> {
        let (i, j) = (first.index as usize, second.index as usize);
        if i == j || i.max(j) >= self.slots.len() {
            return None;
        }
        let (below, from) = self.slots.split_at_mut(i.max(j));
        let (a, b) = if i < j {
            (below.get_mut(i)?, from.first_mut()?)
        } else {
            (from.first_mut()?, below.get_mut(j)?)
        };
        Some((a.alive_mut(first)?, b.alive_mut(second)?))
    }

    /// Removes and returns the entry named by `handle`.
    pub fn remove(&mut self, handle: Handle) -> Option<T> {
        let slot = self
            .slots
            .get_mut(handle.index as usize)
            .filter(|slot| slot.generation == handle.generation)?;
        let value = slot.value.take()?;
        slot.generation = slot.generation.wrapping_add(1);
        self.free.push(handle.index);
        self.len -= 1;
        Some(value)
    }

    /// The handle of the live entry at `index`, if any.
    pub fn handle_at(&self, index: u32) -> Option<Handle> {
        let slot = self.slots.get(index as usize)?;
        slot.value.as_ref().map(|_| Handle {
            index,
            generation: slot.generation,
        })
    }

    /// Number of live entries.
    pub fn len(&self) -> usize {
        self.len
    }

    /// `true` when no entry is alive.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Iterates over live entries with their handles.
    pub fn iter(&self) -> impl Iterator<Item = (Handle, &T)> {
        self.slots.iter().enumerate().filter_map(|(index, slot)| {
            let handle = Handle {
                index: index as u32,
                generation: slot.generation,
            };
            slot.value.as_ref().map(|value| (handle, value))
        })
    }

    /// Iterates mutably over live entries with their handles.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (Handle, &mut T)> {
        self.slots
            .iter_mut()
            .enumerate()
            .filter_map(|(index, slot)| {
                let handle = Handle {
                    index: index as u32,
                    generation: slot.generation,
                };
                slot.value.as_mut().map(|value| (handle, value))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pair_is_two_different_live_entries_in_the_order_asked() {
        let mut table = Table::default();
        let a = table.insert('a');
        let b = table.insert('b');
        let c = table.insert('c');
        assert_eq!(table.get_pair_mut(a, c), Some((&mut 'a', &mut 'c')));
        assert_eq!(table.get_pair_mut(c, a), Some((&mut 'c', &mut 'a')));
        assert_eq!(table.get_pair_mut(b, b), None);
        table.remove(b);
        assert_eq!(table.get_pair_mut(a, b), None);
        let stale = b;
        let reused = table.insert('d');
        assert_eq!(reused.index(), stale.index());
        assert_eq!(table.get_pair_mut(stale, a), None);
        assert_eq!(table.get_pair_mut(reused, a), Some((&mut 'd', &mut 'a')));
        let unknown = Handle {
            index: 9,
            generation: 0,
        };
        assert_eq!(table.get_pair_mut(a, unknown), None);
    }

    #[test]
    fn stale_handles_do_not_alias_new_entries() {
        let mut table = Table::default();
        let a = table.insert("a");
        assert_eq!(table.remove(a), Some("a"));
        let b = table.insert("b");
        assert_eq!(a.index(), b.index());
        assert_eq!(table.get(a), None);
        assert_eq!(table.get(b), Some(&"b"));
        assert_eq!(table.remove(a), None);
        assert_eq!(table.len(), 1);
    }
}
