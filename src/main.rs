//! The `toolmux` binary. The command itself is [`toolmux::cli`], in the library, so that an
//! optimised build compiles it (and every generic it reaches) once.

fn main() -> std::process::ExitCode {
    toolmux::cli::main()
}
