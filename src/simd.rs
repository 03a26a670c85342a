//! Wider vector units without target-specific code: [`widest!`] compiles one plain-Rust body
//! (loops the compiler vectorises) for the target's baseline and, on x86-64, also for AVX2+FMA
//! and AVX-512, and picks the widest the CPU has at run time. On aarch64 the baseline is NEON,
//! which every aarch64 CPU has, so the same bodies vectorise there with nothing to pick; the one
//! kernel that gains from a newer instruction (the byte dot product of the graph walk, with
//! SDOT) picks it itself (`index::graph`). [`path`] names what runs on this CPU.

/// Defines `fn $name` that runs `$body` compiled for the widest vector unit the CPU has: on
/// x86-64, AVX-512 (F and BW, for byte and word arithmetic) or AVX2+FMA when detected at run time; otherwise (and on every other target)
/// the baseline build. The body is written once; only the instructions chosen differ.
macro_rules! widest {
    ($(#[$meta:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$meta])*
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            fn body($($arg: $ty),*) $(-> $ret)? $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512bw")]
                unsafe fn avx512($($arg: $ty),*) $(-> $ret)? {
                    body($($arg),*)
                }
                #[target_feature(enable = "avx2,fma")]
                unsafe fn avx2($($arg: $ty),*) $(-> $ret)? {
                    body($($arg),*)
                }
                if std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("avx512bw") {
                    // SAFETY: the CPU has just been found to support AVX-512F and BW.
                    return unsafe { avx512($($arg),*) };
                }
                if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
                    // SAFETY: the CPU has just been found to support AVX2 and FMA.
                    return unsafe { avx2($($arg),*) };
                }
            }
            body($($arg),*)
        }
    };
}

pub(crate) use widest;

/// The vector paths this CPU runs, for logs and for the cross-architecture checks
/// (`scripts/test-arm64.sh`): `x86-64 avx512`, `x86-64 avx2+fma`, `x86-64 baseline`,
/// `aarch64 neon+dotprod`, `aarch64 neon`, or the target's name elsewhere.
pub fn path() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("avx512bw") {
            return "x86-64 avx512";
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
            return "x86-64 avx2+fma";
        }
        "x86-64 baseline"
    }
    #[cfg(target_arch = "aarch64")]
    {
        if std::arch::is_aarch64_feature_detected!("dotprod") { "aarch64 neon+dotprod" } else { "aarch64 neon" }
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        std::env::consts::ARCH
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn names_the_vector_path_this_cpu_runs() {
        let path = super::path();
        // Printed for scripts/test-arm64.sh, which checks it against the emulated CPU model.
        eprintln!("simd path: {path}");
        assert!(path.starts_with(std::env::consts::ARCH.replace('_', "-").as_str()), "{path}");
    }
}
