//! Compiles kubelet's gRPC APIs into Rust: the device plugin API
//! (proto/deviceplugin/v1beta1/api.proto) with the `device-plugin` feature, and the plugin
//! registration and DRA APIs (proto/pluginregistration, proto/dra) with the `dra` feature. The
//! protos are parsed by protox, a protobuf compiler written in Rust, rather than by a system
//! protoc: building vramgate needs nothing but cargo and a C compiler (the README's first
//! command runs on a bare Debian machine).

fn main() {
    #[cfg(feature = "device-plugin")]
    compile(
        &["proto/deviceplugin/v1beta1/api.proto"],
        &["proto/deviceplugin/v1beta1"],
    );
    #[cfg(feature = "dra")]
    compile(
        &[
            "proto/pluginregistration/v1/api.proto",
            "proto/dra/v1/api.proto",
            "proto/dra/v1beta1/api.proto",
        ],
        &["proto"],
    );
}

/// Generates both sides of every service in `protos`: vramgate serves DevicePlugin,
/// Registration (plugin registration) and DRAPlugin, and calls the device plugin
/// Registration; the tests and the benches play kubelet, which does the opposite.
#[cfg(feature = "device-plugin")]
fn compile(protos: &[&str], includes: &[&str]) {
    for proto in protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    let fds = match protox::compile(protos, includes) {
        Ok(fds) => fds,
        Err(e) => {
            // One line naming the file, instead of a panic's backtrace.
            eprintln!("cannot parse {}: {e}", protos.join(", "));
            std::process::exit(1);
        }
    };
    if let Err(e) = tonic_build::configure().compile_fds(fds) {
        eprintln!("cannot generate Rust for {}: {e}", protos.join(", "));
        std::process::exit(1);
    }
}
