//! Compiles kubelet's device plugin API (proto/deviceplugin/v1beta1/api.proto) into Rust, only
//! when the `device-plugin` feature is on: a build without it needs no protoc.

fn main() {
    #[cfg(feature = "device-plugin")]
    {
        const PROTO: &str = "proto/deviceplugin/v1beta1/api.proto";
        println!("cargo:rerun-if-changed={PROTO}");
        // Both sides of both services: the plugin serves DevicePlugin and calls Registration;
        // the tests and the bench play kubelet, which does the opposite.
        if let Err(e) = tonic_build::configure().compile_protos(&[PROTO], &["proto/deviceplugin/v1beta1"]) {
            // One line, naming the usual cause, instead of a panic's backtrace.
            eprintln!("cannot compile {PROTO}: {e} (is protoc installed? Debian: apt-get install protobuf-compiler)");
            std::process::exit(1);
        }
    }
}
