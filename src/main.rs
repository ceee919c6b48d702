//! The `openmed-op` binary; everything it does lives in the library.

/// jemalloc instead of the C library's allocator: the scale benchmark at
/// 1,000 models measured a fifth less CPU to converge with it on glibc, at
/// the same memory (`benches/results/2026-11-30-allocators.md`); and the
/// static image would otherwise get musl's allocator, known to be slow
/// when many threads allocate.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's settings, read when it starts. A background thread returns
/// unused pages on time even when the operator is idle and allocates
/// nothing (without it, jemalloc only tidies up when asked for memory).
#[unsafe(export_name = "_rjem_malloc_conf")]
static MALLOC_CONF: &[u8; 23] = b"background_thread:true\0";

fn main() -> std::process::ExitCode {
    openmed_op::cli::main()
}
