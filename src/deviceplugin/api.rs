//! kubelet's device plugin API, v1beta1: the Rust that build.rs generates from
//! proto/deviceplugin/v1beta1/api.proto (both services, both sides: the plugin serves
//! `DevicePlugin` and calls `Registration`; tests and benches play kubelet).

#![allow(clippy::all)]

tonic::include_proto!("v1beta1");
