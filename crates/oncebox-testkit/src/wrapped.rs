//! A handler's own error around a driver's, as error-context libraries make one: what the
//! stores must see through to tell the storage's failure from the event's.

use std::fmt;

/// `E` wrapped with a message of the handler's own, `E` its source.
#[derive(Debug)]
pub struct WithContext<E>(pub E);

impl<E> fmt::Display for WithContext<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("storing the receipt failed")
    }
}

impl<E: std::error::Error + 'static> std::error::Error for WithContext<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}
