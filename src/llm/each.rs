//! A slice serialised as a JSON array through a borrowing wrapper per element: the renderers
//! write wire objects straight from the neutral types without building them first.

use serde::{Serialize, Serializer};

/// `items`, each serialised as `wrap(item)`.
pub(crate) struct Each<'a, T, W>(pub &'a [T], pub fn(&'a T) -> W);

impl<'a, T, W: Serialize> Serialize for Each<'a, T, W> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter().map(self.1))
    }
}
