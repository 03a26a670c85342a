//! Wider vector units without target-specific code: [`widest!`] compiles one plain-Rust body
//! (loops the compiler vectorises) for the target's baseline and, on x86-64, also for AVX2+FMA
//! and AVX-512, and picks the widest the CPU has at run time. On aarch64 the baseline is NEON and
//! there is nothing to pick.

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
