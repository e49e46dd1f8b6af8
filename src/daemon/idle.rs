//! Memory given back when the daemon turns idle (SPEC §16.3: memory bounded by configuration,
//! not by history). glibc keeps the pages a burst freed: in the senders soak (docs/BENCHMARKS.md)
//! heaptrack saw a live heap of 2.6–3.6 MB while anonymous memory grew to 11.8 MB. Every
//! [`CHECK_EVERY`], if messages finished since the last check and none is running or queued
//! now, the kept request-body buffers are freed (`llm::body_pool`) and `malloc_trim(0)` returns the free pages of every arena to the kernel (a few
//! milliseconds for a heap this size, on a blocking thread).

use std::time::Duration;

use super::services::{Services, Tasks};

/// How often the daemon looks whether it turned idle.
pub const CHECK_EVERY: Duration = Duration::from_secs(5);

/// Start the idle check on the run's tracker.
pub fn start(s: &Services, tasks: &Tasks) {
    let (dispatcher, metrics) = (s.dispatcher.clone(), s.metrics.clone());
    let stop = tasks.stop.clone();
    tasks.tracker.spawn(async move {
        let mut trimmed_at = metrics.messages_finished();
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(CHECK_EVERY) => {}
            }
            let finished = metrics.messages_finished();
            let idle = dispatcher.active_sessions() == 0 && dispatcher.queue_depth() == 0;
            if finished != trimmed_at && idle {
                trimmed_at = finished;
                let _ = tokio::task::spawn_blocking(trim).await;
            }
        }
    });
}

/// Free the kept request-body buffers and return free heap pages to the kernel (glibc only;
/// elsewhere nothing).
fn trim() {
    crate::llm::body_pool::release();
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks the allocator's own free lists; it is thread-safe.
    unsafe {
        nix::libc::malloc_trim(0);
    }
}
