//! Handing freed heap memory back to the system.
//!
//! glibc's allocator keeps freed pages for reuse, and after a large free (the model's load frees
//! tens of MB) it serves even multi-MB allocations from its heap rather than from their own
//! mappings, so their memory stays resident once freed. The gateway trims after sessions end
//! (`http::give_back_memory`) and after an index build (`store`), which frees the catalog's f32
//! vectors once their compact forms are made.

/// Returns free heap memory to the system where the allocator keeps it (glibc); true if any was.
/// Walks the heap once: milliseconds.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn trim() -> bool {
    // SAFETY: malloc_trim only walks and releases the allocator's free memory; it takes the
    // allocator's own locks and touches no memory still allocated.
    unsafe { libc::malloc_trim(0) == 1 }
}

/// Elsewhere the allocator decides alone.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn trim() -> bool {
    false
}
