//! The `openmed-op` binary; everything it does lives in the library.

fn main() -> std::process::ExitCode {
    openmed_op::cli::main()
}
