// emu_mma.cpp: what include/mma.h (nvcuda::wmma) keeps out of the header:
// the fixed scrambles of the fragments' elements over the lanes, and the
// checks of a load's or a store's arguments.
#include <map>
#include <vector>
#include "emu.h"
#include "mma.h"

namespace emu {
namespace wmma_impl {

// Element e's copies go to slots drawn by a Fisher-Yates shuffle from an
// xorshift seeded by the fragment type's key: fixed from run to run (not
// EMU_SEED's), and other for every type, so that no two types share a layout.
const uint16_t *scramble(unsigned key, int per_lane) {
    static std::map<unsigned, std::vector<uint16_t>> tables;
    std::vector<uint16_t> &t = tables[key];
    if (!t.empty()) return t.data();
    int slots = 32 * per_lane;
    t.resize((size_t)slots);
    for (int s = 0; s < slots; s++) t[(size_t)s] = (uint16_t)s;
    uint64_t x = 0x9E3779B97F4A7C15ull * (key + 1);
    for (int s = slots - 1; s > 0; s--) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        std::swap(t[(size_t)s], t[(size_t)(x % (uint64_t)(s + 1))]);
    }
    return t.data();
}

static const char *op_name(WarpKind op) {
    return op == WARP_WMMA_LOAD ? "wmma::load_matrix_sync" : "wmma::store_matrix_sync";
}

void check_matrix_args(WarpKind op, void *const lanes[32], size_t elem_bytes, const char *file, int line) {
    const MatrixArgs *first = (const MatrixArgs *)lanes[0];
    for (int l = 1; l < 32; l++) {
        const MatrixArgs *a = (const MatrixArgs *)lanes[l];
        if (a->ptr != first->ptr || a->ldm != first->ldm || a->row_major != first->row_major)
            die("%s:%d: %s in %s: lane %d passes %p, ldm %u, %s where lane 0 passes %p, ldm %u, %s (every lane "
                "passes the same)", file, line, op_name(op), running_kernel_text().c_str(), l, a->ptr, a->ldm,
                a->row_major ? "row major" : "col major", first->ptr, first->ldm,
                first->row_major ? "row major" : "col major");
    }
    if ((uintptr_t)first->ptr % 32)
        die("%s:%d: %s in %s: the pointer %p is not 256-bit aligned", file, line, op_name(op),
            running_kernel_text().c_str(), first->ptr);
    if (first->ldm * elem_bytes % 16)
        die("%s:%d: %s in %s: ldm %u (elements of %zu bytes) is not a multiple of 16 bytes", file, line, op_name(op),
            running_kernel_text().c_str(), first->ldm, elem_bytes);
}

}  // namespace wmma_impl
}  // namespace emu
