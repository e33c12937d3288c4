fn main() -> std::process::ExitCode {
    media_worker::cli::main()
}
