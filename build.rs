//! Compiles kubelet's device plugin API (proto/deviceplugin/v1beta1/api.proto) into Rust, only
//! when the `device-plugin` feature is on. The proto is parsed by protox, a protobuf compiler
//! written in Rust, rather than by a system protoc: building vramgate needs nothing but cargo
//! and a C compiler (the README's first command runs on a bare Debian machine).

fn main() {
    #[cfg(feature = "device-plugin")]
    {
        const PROTO: &str = "proto/deviceplugin/v1beta1/api.proto";
        const INCLUDE: &str = "proto/deviceplugin/v1beta1";
        println!("cargo:rerun-if-changed={PROTO}");
        let fds = match protox::compile([PROTO], [INCLUDE]) {
            Ok(fds) => fds,
            Err(e) => {
                // One line naming the file, instead of a panic's backtrace.
                eprintln!("cannot parse {PROTO}: {e}");
                std::process::exit(1);
            }
        };
        // Both sides of both services: the plugin serves DevicePlugin and calls Registration;
        // the tests and the bench play kubelet, which does the opposite.
        if let Err(e) = tonic_build::configure().compile_fds(fds) {
            eprintln!("cannot generate Rust for {PROTO}: {e}");
            std::process::exit(1);
        }
    }
}
