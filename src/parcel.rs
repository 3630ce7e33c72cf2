//! Parcel buffers handed back: the stage chain moves changes between tasks in `Vec`s that
//! hold them inline (128 bytes each), filled by one task and emptied by another, often
//! on another thread.
//!
//! Freed where it was emptied, such a block goes back to the allocator of the thread that
//! made it only lazily, and the allocator keeps the pages around meanwhile: a steady stream
//! of parcels then costs far more resident memory than the few in flight at once. So the
//! emptying end hands each buffer back through [`Spares`], and the filling end fills it
//! again; no block is freed or allocated per parcel once the stream runs.

use std::sync::{Arc, Mutex, PoisonError};

/// Emptied buffers, shared by the end that fills parcels and the end that empties them
/// (clones share one store). Holds at most `keep` buffers; more given back are freed.
#[derive(Debug)]
pub struct Spares<T> {
    store: Arc<Mutex<Vec<Vec<T>>>>,
    keep: usize,
}

impl<T> Clone for Spares<T> {
    fn clone(&self) -> Self {
        Spares {
            store: Arc::clone(&self.store),
            keep: self.keep,
        }
    }
}

impl<T> Spares<T> {
    /// A store keeping at most `keep` buffers.
    pub fn new(keep: usize) -> Self {
        Spares {
            store: Arc::new(Mutex::new(Vec::with_capacity(keep))),
            keep,
        }
    }

    /// An empty buffer with room for at least `capacity` items: a spare if one is waiting,
    /// else a new one.
    pub fn take(&self, capacity: usize) -> Vec<T> {
        let spare = self
            .store
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        match spare {
            Some(mut buffer) => {
                buffer.reserve(capacity);
                buffer
            }
            None => Vec::with_capacity(capacity),
        }
    }

    /// Hands `buffer` back to be filled again. What it still holds is dropped first; a
    /// buffer that never allocated, or one more than the store keeps, is freed.
    pub fn give(&self, mut buffer: Vec<T>) {
        buffer.clear();
        if buffer.capacity() == 0 {
            return;
        }
        let extra = {
            let mut store = self.store.lock().unwrap_or_else(PoisonError::into_inner);
            if store.len() < self.keep {
                store.push(buffer);
                None
            } else {
                Some(buffer)
            }
        };
        // Freed outside the lock.
        drop(extra);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_given_back_is_taken_again_with_its_room() {
        let spares: Spares<u64> = Spares::new(1);
        let mut buffer = spares.take(8);
        buffer.extend(0..8);
        let at = buffer.as_ptr();
        spares.clone().give(buffer);
        let again = spares.take(4);
        assert!(again.is_empty(), "handed back empty");
        assert_eq!(again.as_ptr(), at, "the same block, not a new one");
        assert!(again.capacity() >= 8);
        // Room is made when the spare is smaller than asked for.
        spares.give(again);
        assert!(spares.take(100).capacity() >= 100);
    }

    #[test]
    fn keeps_at_most_its_count() {
        let spares: Spares<u8> = Spares::new(2);
        for _ in 0..4 {
            spares.give(Vec::with_capacity(16));
        }
        spares.give(Vec::new());
        assert_eq!(spares.store.lock().map(|s| s.len()).unwrap_or(0), 2);
    }
}
