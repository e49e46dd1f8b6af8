//! Request-body buffers kept between provider calls (SPEC §16.6: a flat cost per message).
//!
//! A long session's request body is hundreds of KiB. Allocated fresh for every call, it is
//! above the daemon's fixed 128 KiB mmap threshold (bin/agentd.rs), so every call mapped new
//! pages and faulted each of them in while the cached history was copied into it: a cost that
//! grows with the history (docs/BENCHMARKS.md, overhead). The renderers take a buffer from
//! here instead ([`take`]), and the body handed to the HTTP client ([`into_body`]) gives its
//! buffer back when the client drops it, pages still mapped, for the next call.
//!
//! **Bounds.** At most [`MAX_KEPT`] buffers, each at most [`MAX_KEPT_BYTES`]; a larger one is
//! freed as usual. [`release`] frees them all: the daemon calls it when it turns idle
//! (`daemon::idle`), so an idle daemon holds none.

use std::sync::Mutex;

use bytes::Bytes;

/// Buffers kept: the calls in flight at once on a small machine (one per busy session).
pub const MAX_KEPT: usize = 4;

/// A buffer larger than this is not kept (the one long call it served may never recur).
pub const MAX_KEPT_BYTES: usize = 8 * 1024 * 1024;

/// A set of kept buffers. The daemon uses one, [`POOL`], through the free functions below; a
/// test uses its own.
pub struct BodyPool {
    bufs: Mutex<Vec<Vec<u8>>>,
}

/// The daemon's pool.
pub static POOL: BodyPool = BodyPool::new();

impl BodyPool {
    pub const fn new() -> BodyPool {
        BodyPool {
            bufs: Mutex::new(Vec::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Vec<u8>>> {
        self.bufs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An empty buffer with room for at least `size` bytes: the largest kept one if any.
    pub fn take(&self, size: usize) -> Vec<u8> {
        let kept = self.lock().pop();
        match kept {
            Some(mut buf) => {
                buf.clear();
                buf.reserve(size);
                buf
            }
            None => Vec::with_capacity(size),
        }
    }

    /// Give `buf` back for a later call (dropped instead when the pool is full or it is too
    /// big).
    pub fn give_back(&self, mut buf: Vec<u8>) {
        if buf.capacity() == 0 || buf.capacity() > MAX_KEPT_BYTES {
            return;
        }
        buf.clear();
        let mut bufs = self.lock();
        if bufs.len() < MAX_KEPT {
            bufs.push(buf);
            // Largest last, so `take` hands out the one most likely to need no growth.
            bufs.sort_unstable_by_key(Vec::capacity);
        }
    }

    /// Free every kept buffer.
    pub fn release(&self) {
        let freed = std::mem::take(&mut *self.lock());
        drop(freed);
    }

    /// Bytes held by kept buffers.
    pub fn kept_bytes(&self) -> usize {
        self.lock().iter().map(Vec::capacity).sum()
    }

    /// A rendered body as the HTTP client's bytes, without a copy; the buffer comes back to
    /// this pool when the last reference to the bytes is dropped.
    pub fn into_body(&'static self, buf: Vec<u8>) -> Bytes {
        Bytes::from_owner(Pooled { buf, pool: self })
    }
}

impl Default for BodyPool {
    fn default() -> BodyPool {
        BodyPool::new()
    }
}

/// [`BodyPool::take`] of the daemon's pool.
pub fn take(size: usize) -> Vec<u8> {
    POOL.take(size)
}

/// [`BodyPool::release`] of the daemon's pool (the daemon turned idle).
pub fn release() {
    POOL.release();
}

/// [`BodyPool::into_body`] of the daemon's pool.
pub fn into_body(buf: Vec<u8>) -> Bytes {
    POOL.into_body(buf)
}

struct Pooled {
    buf: Vec<u8>,
    pool: &'static BodyPool,
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        self.pool.give_back(std::mem::take(&mut self.buf));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Its own pool: the daemon's is shared by every test that renders a request.
    static TEST_POOL: BodyPool = BodyPool::new();

    #[test]
    fn buffers_come_back_bounded_and_are_released() {
        let pool = &TEST_POOL;
        // A body's buffer comes back when its bytes are dropped, with its capacity.
        let mut buf = pool.take(300_000);
        buf.extend_from_slice(b"{\"messages\":[]}");
        let ptr = buf.as_ptr();
        let body = pool.into_body(buf);
        assert_eq!(&body[..], b"{\"messages\":[]}");
        let clone = body.clone();
        drop(body);
        assert_eq!(pool.kept_bytes(), 0, "still referenced by a clone");
        drop(clone);
        assert!(pool.kept_bytes() >= 300_000);
        let again = pool.take(1000);
        assert_eq!(again.as_ptr(), ptr, "the same allocation is reused");
        assert!(again.is_empty());
        pool.give_back(again);

        // At most MAX_KEPT buffers, none above MAX_KEPT_BYTES.
        for _ in 0..MAX_KEPT + 3 {
            pool.give_back(Vec::with_capacity(1024));
        }
        pool.give_back(Vec::with_capacity(MAX_KEPT_BYTES + 1));
        assert_eq!(pool.lock().len(), MAX_KEPT);
        assert!(pool.kept_bytes() <= MAX_KEPT * MAX_KEPT_BYTES);

        pool.release();
        assert_eq!(pool.kept_bytes(), 0);
    }
}
