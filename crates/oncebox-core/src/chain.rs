//! Finding a cause of one type in an error's chain of sources: an error reaches its reader
//! wrapped by the layers between (a handler's context, a body's transport), and what decides
//! its answer is the cause inside.

use std::error::Error;

/// The first `T` in `error` or the sources it wraps, outermost first.
pub fn cause<'a, T: Error + 'static>(error: &'a (dyn Error + 'static)) -> Option<&'a T> {
    let mut next = Some(error);
    while let Some(e) = next {
        if let Some(found) = e.downcast_ref::<T>() {
            return Some(found);
        }
        next = e.source();
    }
    None
}
