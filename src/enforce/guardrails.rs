//! Framework guardrails: environment variables that make TensorFlow and JAX allocate what
//! they use instead of most of the GPU at start. They are advice to the allocator inside the
//! container, not a limit: a program that sets its own options, or PyTorch (which has no such
//! variable), is not held by them. The container's own values always win.
//!
//! Sources: TensorFlow reads `TF_FORCE_GPU_ALLOW_GROWTH` (tensorflow.org/guide/gpu, "Limiting
//! GPU memory growth"). JAX: <https://docs.jax.dev/en/latest/gpu_memory_allocation.html>:
//! `XLA_PYTHON_CLIENT_PREALLOCATE=false` stops the 75% preallocation, and the memory fraction,
//! now named `XLA_CLIENT_MEM_FRACTION` (the old `XLA_PYTHON_CLIENT_MEM_FRACTION` is deprecated
//! but is the only name older JAX versions read), caps JAX's allocator at that share of the
//! GPU's total memory, preallocated or not.

use super::{env_has, PlacedShare};
use crate::config::EnforceConfig;

pub const TF_ALLOW_GROWTH: &str = "TF_FORCE_GPU_ALLOW_GROWTH";
pub const JAX_PREALLOCATE: &str = "XLA_PYTHON_CLIENT_PREALLOCATE";
/// JAX's current name for the memory fraction.
pub const JAX_MEM_FRACTION: &str = "XLA_CLIENT_MEM_FRACTION";
/// The deprecated name, still the only one JAX before the rename reads.
pub const JAX_MEM_FRACTION_OLD: &str = "XLA_PYTHON_CLIENT_MEM_FRACTION";

/// The share of the GPU the container reserved, as JAX's memory fraction: the smallest
/// `bytes / total` over its GPUs (JAX takes one fraction for all of them), rounded down to
/// three decimals so that the fraction times any of its GPUs stays within the reservation.
/// `None` when that rounds to zero (a fraction of 0 would leave JAX no memory) or a GPU's
/// total is unknown (0).
pub fn jax_fraction(placed: &[PlacedShare]) -> Option<String> {
    let milli = placed
        .iter()
        .map(|s| {
            if s.total == 0 {
                return 0;
            }
            // u128: bytes * 1000 overflows u64 above 16 PiB; a GPU is far below that, but
            // the numbers come from a driver and a ledger, not from here.
            (u128::from(s.bytes.min(s.total)) * 1000 / u128::from(s.total)) as u64
        })
        .min()?;
    (milli > 0).then(|| format!("{}.{:03}", milli / 1000, milli % 1000))
}

/// Adds the guardrail variables the config switches on and the container does not set
/// itself. Returns whether it added any.
pub fn edits(
    config: &EnforceConfig,
    existing_env: &[String],
    placed: &[PlacedShare],
    env: &mut Vec<(String, String)>,
) -> bool {
    let before = env.len();
    let mut add = |name: &str, value: String| {
        if !env_has(existing_env, name) {
            env.push((name.to_string(), value));
        }
    };
    if config.tensorflow_allow_growth {
        add(TF_ALLOW_GROWTH, "true".to_string());
    }
    if config.jax_disable_preallocation {
        add(JAX_PREALLOCATE, "false".to_string());
    }
    // Either name set by the container is its choice for both: adding the other could
    // contradict it, and which one a given JAX version prefers is its business.
    if config.jax_memory_fraction
        && !env_has(existing_env, JAX_MEM_FRACTION)
        && !env_has(existing_env, JAX_MEM_FRACTION_OLD)
    {
        if let Some(fraction) = jax_fraction(placed) {
            add(JAX_MEM_FRACTION, fraction.clone());
            add(JAX_MEM_FRACTION_OLD, fraction);
        }
    }
    env.len() > before
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::enforce::MIB;

    fn share(bytes: u64, total: u64) -> PlacedShare {
        PlacedShare {
            uuid: "GPU-a".into(),
            index: 0,
            mig_index: None,
            bytes,
            limit: bytes,
            total,
        }
    }

    #[test]
    fn fraction_rounds_down_and_takes_the_smallest_share() {
        assert_eq!(jax_fraction(&[share(1, 3)]).as_deref(), Some("0.333"));
        assert_eq!(jax_fraction(&[share(2, 3)]).as_deref(), Some("0.666"));
        assert_eq!(
            jax_fraction(&[share(1205 * MIB, 24_265 * MIB)]).as_deref(),
            Some("0.049")
        );
        assert_eq!(jax_fraction(&[share(10, 10)]).as_deref(), Some("1.000"));
        // Two GPUs of different sizes: the fraction must fit the smaller share.
        assert_eq!(
            jax_fraction(&[share(4 << 30, 16 << 30), share(4 << 30, 80 << 30)]).as_deref(),
            Some("0.050")
        );
        assert_eq!(jax_fraction(&[share(1, 10_000)]), None, "rounds to zero");
        assert_eq!(jax_fraction(&[share(1, 0)]), None, "unknown total");
        assert_eq!(jax_fraction(&[]), None);
        assert_eq!(jax_fraction(&[share(u64::MAX, u64::MAX)]).as_deref(), Some("1.000"));
    }

    #[test]
    fn the_containers_own_values_win() {
        let config = EnforceConfig::default();
        let existing = [
            "TF_FORCE_GPU_ALLOW_GROWTH=false".to_string(),
            "XLA_PYTHON_CLIENT_MEM_FRACTION=.9".to_string(),
            "PATH=/bin".to_string(),
        ];
        let mut env = Vec::new();
        assert!(edits(&config, &existing, &[share(1 << 30, 4 << 30)], &mut env));
        assert_eq!(
            env,
            [("XLA_PYTHON_CLIENT_PREALLOCATE".to_string(), "false".to_string())]
        );

        let all = [
            "TF_FORCE_GPU_ALLOW_GROWTH=".to_string(),
            "XLA_PYTHON_CLIENT_PREALLOCATE=true".to_string(),
            "XLA_CLIENT_MEM_FRACTION=0.5".to_string(),
        ];
        let mut env = Vec::new();
        assert!(!edits(&config, &all, &[share(1 << 30, 4 << 30)], &mut env));
        assert!(env.is_empty());
    }

    #[test]
    fn each_switch_is_its_own() {
        let placed = [share(1 << 30, 4 << 30)];
        let names = |config: EnforceConfig| {
            let mut env = Vec::new();
            edits(&config, &[], &placed, &mut env);
            env.into_iter().map(|(k, _)| k).collect::<Vec<_>>()
        };
        let off = EnforceConfig {
            tensorflow_allow_growth: false,
            jax_disable_preallocation: false,
            jax_memory_fraction: false,
            ..EnforceConfig::default()
        };
        assert!(names(off.clone()).is_empty());
        assert_eq!(
            names(EnforceConfig {
                tensorflow_allow_growth: true,
                ..off.clone()
            }),
            [TF_ALLOW_GROWTH]
        );
        assert_eq!(
            names(EnforceConfig {
                jax_memory_fraction: true,
                ..off
            }),
            [JAX_MEM_FRACTION, JAX_MEM_FRACTION_OLD]
        );
    }
}
