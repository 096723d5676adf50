// Fixed-width integer names for device code compiled without the C library headers.
#pragma once

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef int i32;
typedef unsigned long long u64;
typedef long long i64;

// A CUtensorMap as the driver encodes it: 128 opaque bytes, 64-byte aligned.
struct alignas(64) TmaDesc {
    u64 words[16];
};
