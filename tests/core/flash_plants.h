// flash_plants.h: one planted bug in FlashAttention's shared math, for
// test_flash. The Makefile builds kernels_cpu_flash.c again with this file
// included first and one FLASH_PLANT_* defined (its entry points renamed);
// flash_math.h is then already included, so the kernel's own include is
// skipped and its calls reach the planted versions below.
#pragma once
#include "flash_math.h"

#if defined(FLASH_PLANT_running_max)
// the running maximum forgets the earlier tiles: the tile's own maximum
static inline float planted_running_max(float m, float tile_max) {
    (void)m;
    return tile_max;
}
#define flash_running_max planted_running_max
#elif defined(FLASH_PLANT_rescale)
// what a row summed before a larger maximum is never rescaled
static inline float planted_rescale(float m_old, float m_new) {
    (void)m_new;
    return m_old == -INFINITY ? 0.0f : 1.0f;
}
#define flash_rescale planted_rescale
#elif defined(FLASH_PLANT_mask)
// the causal mask off by one: each row also sees the next key
static inline int planted_visible(int i0, int r, int j0, int cols) {
    int n = i0 + r - j0 + 2;
    return n < cols ? n : cols;
}
#define flash_visible planted_visible
#else
#error "define one FLASH_PLANT_*"
#endif
