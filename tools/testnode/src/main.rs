//! `testnode`: starts, shows and stops the one-node Kubernetes the real-node tests use.

fn main() {
    std::process::exit(testnode::cli::main(std::env::args_os().skip(1).collect()));
}
