//! The global allocator (feature `mimalloc`, on by default): mimalloc, asked the way it is
//! fastest.
//!
//! A call through `toolmux serve` allocates on the thread that reads the client and frees
//! on the thread that reads the upstream, the pattern glibc's malloc serves worst (see
//! crates/toolmux-mcp/BENCHMARKS-serve.md). The `mimalloc` crate's allocator asks for every
//! block with its alignment (`mi_malloc_aligned`), and mimalloc 3 serves an aligned request
//! from its fast path only when the size class's free list has a block: on these threads the
//! lists are often empty (the blocks come back to the other thread's list first), and then
//! a block of any size that is not a power of two is over-allocated in a larger size class,
//! at about 100 more instructions each (some 1,500 per call). Here a block needing no more
//! than word alignment, which every mimalloc block has, is asked for plainly, as Rust's own
//! `System` allocator does with `malloc`.

// The allocator interface is unsafe by nature; each call forwards the caller's promises.
#![allow(unsafe_code)]

use libmimalloc_sys::{
    mi_free, mi_malloc, mi_malloc_aligned, mi_realloc, mi_realloc_aligned, mi_zalloc,
    mi_zalloc_aligned,
};
use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;

/// Every mimalloc block is aligned to a word: its size classes are whole words, and a page's
/// first block is aligned to 16 bytes.
const PLAIN_ALIGN: usize = size_of::<usize>();

/// mimalloc as the global allocator (see the module's documentation).
pub(crate) struct Mimalloc;

// SAFETY: mimalloc's functions are thread-safe and meet `GlobalAlloc`'s contract: a block
// is at least as large as asked and aligned as asked (plainly asked blocks only for an
// alignment of at most `PLAIN_ALIGN`, which every block has), `mi_free` frees blocks of
// either kind, and `mi_realloc` keeps the contents up to the smaller size.
unsafe impl GlobalAlloc for Mimalloc {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: `layout` has a non-zero size (the caller's promise).
        unsafe { allocate(layout, mi_malloc, mi_malloc_aligned) }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for `alloc`.
        unsafe { allocate(layout, mi_zalloc, mi_zalloc_aligned) }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: `ptr` was allocated by this allocator (the caller's promise).
        unsafe { mi_free(ptr.cast::<c_void>()) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` was allocated by this allocator with `layout`, and `new_size` is
        // non-zero (the caller's promises).
        unsafe {
            if layout.align() <= PLAIN_ALIGN {
                mi_realloc(ptr.cast::<c_void>(), new_size).cast()
            } else {
                mi_realloc_aligned(ptr.cast::<c_void>(), new_size, layout.align()).cast()
            }
        }
    }
}

/// A block for `layout` from `plain` when it needs at most word alignment, else from
/// `aligned`.
///
/// # Safety
/// `layout` has a non-zero size.
#[inline]
unsafe fn allocate(
    layout: Layout,
    plain: unsafe extern "C" fn(usize) -> *mut c_void,
    aligned: unsafe extern "C" fn(usize, usize) -> *mut c_void,
) -> *mut u8 {
    // SAFETY: mimalloc takes any size and a power-of-two alignment, which a `Layout` has.
    unsafe {
        if layout.align() <= PLAIN_ALIGN {
            plain(layout.size()).cast()
        } else {
            aligned(layout.size(), layout.align()).cast()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Blocks of every size class up to a few pages, at every alignment Rust types use, come
    /// back aligned as asked, zeroed when asked, and keep their contents through growing
    /// and shrinking.
    #[test]
    fn blocks_are_aligned_zeroed_and_kept_as_asked() {
        let sizes = (1..=300).chain([511, 512, 513, 1000, 4096, 65_536, 300_000]);
        for size in sizes {
            for align in [1, 2, 4, 8, 16, 32, 64, 128, 4096] {
                let layout = Layout::from_size_align(size, align).expect("a layout");
                // SAFETY: a non-zero size; each block is freed once, with its layout.
                unsafe {
                    let zeroed = Mimalloc.alloc_zeroed(layout);
                    assert!(!zeroed.is_null());
                    assert_eq!(zeroed as usize % align, 0, "zeroed {size} aligned {align}");
                    assert!(std::slice::from_raw_parts(zeroed, size).iter().all(|&b| b == 0));
                    let block = Mimalloc.alloc(layout);
                    assert!(!block.is_null());
                    assert_eq!(block as usize % align, 0, "{size} aligned {align}");
                    for i in 0..size {
                        block.add(i).write(i as u8);
                    }
                    let grown = Mimalloc.realloc(block, layout, size * 3);
                    assert_eq!(grown as usize % align, 0, "grown {size} aligned {align}");
                    assert!((0..size).all(|i| grown.add(i).read() == i as u8));
                    let grown_layout = Layout::from_size_align(size * 3, align).expect("a layout");
                    let shrunk = Mimalloc.realloc(grown, grown_layout, size.div_ceil(2));
                    assert_eq!(shrunk as usize % align, 0, "shrunk {size} aligned {align}");
                    assert!((0..size.div_ceil(2)).all(|i| shrunk.add(i).read() == i as u8));
                    let shrunk_layout =
                        Layout::from_size_align(size.div_ceil(2), align).expect("a layout");
                    Mimalloc.dealloc(shrunk, shrunk_layout);
                    Mimalloc.dealloc(zeroed, layout);
                }
            }
        }
    }

    /// Blocks allocated on one thread and freed on another, the serving threads' pattern,
    /// are reused aligned as asked.
    #[test]
    fn blocks_freed_on_another_thread_come_back_aligned() {
        let (tx, rx) = std::sync::mpsc::channel::<Vec<Box<[u64]>>>();
        let freer = std::thread::spawn(move || {
            for blocks in rx {
                drop(blocks);
            }
        });
        for round in 0..200 {
            let blocks: Vec<Box<[u64]>> = (1..40).map(|n| vec![round; n].into()).collect();
            for block in &blocks {
                assert_eq!(block.as_ptr() as usize % align_of::<u64>(), 0);
                assert!(block.iter().all(|&v| v == round));
            }
            tx.send(blocks).expect("the freeing thread");
        }
        drop(tx);
        freer.join().expect("the freeing thread");
    }
}
