// activations.c: memory_math's activation section: Korthikanti et al.'s
// per-layer formula beside what this trainer saves for backward
// (gpt_activation_bytes), for one micro-batch of B sequences of T tokens.
#include <math.h>
#include "memory_math.h"

#define GB 1e9

static const Col act_cols[] = {
    {"what", "what", 32, NULL},
    {"bytes_per_element", "B/elem", 6, "%.0f"},
    {"per_layer_bytes", "per layer bytes", 15, PRINT_GROUPED},
    {"per_layer_gb", "per layer GB", 12, "%.3f"},
    {"saved_gb", "saved total GB", 14, "%.3f"},
    {"backward_scratch_gb", "bwd scratch GB", 14, "%.3f"},
    {"grad_workspace_gb", "grad wksp GB", 12, "%.3f"},
};

static void trainer_row(Printer *p, const Inputs *in, const char *what, int act_bytes) {
    GPTPlan plan = gpt_plan_whole(&in->layout, in->batch, in->seq_len);
    GPTActBytes a = gpt_activation_bytes(&in->layout, &plan, act_bytes);
    Cell row[7] = {cell_str(what), cell_num(act_bytes), cell_num((double)a.per_layer),
                   cell_num(a.per_layer / GB), cell_num(a.total_saved / GB),
                   cell_num(a.backward_scratch / GB), cell_num(a.grad_workspace / GB)};
    printer_row(p, row);
}

void section_activations(Printer *p, const Inputs *in) {
    const GPTConfig *c = &in->layout.cfg;
    double s = in->seq_len, b = in->batch, h = c->channels, a = c->num_heads, L = c->num_layers;
    printer_section(p, "activations",
                    "Activations of one micro-batch per rank, computed from the formulas");
    printer_num(p, "layers", "L (layers)", L, "%.0f", NULL);
    printer_num(p, "heads", "a (heads)", a, "%.0f", NULL);
    printer_num(p, "hidden", "h (channels)", h, "%.0f", NULL);
    printer_num(p, "vocab", "V (vocabulary)", c->vocab_size, "%.0f", NULL);
    printer_num(p, "context", "context (wpe rows)", c->max_seq_len, "%.0f", NULL);

    double k_layer = korthikanti_layer_bytes(s, b, h, a);
    printer_table(p, "rows", act_cols, 7);
    Cell krow[7] = {cell_str("Korthikanti sbh(34 + 5as/h)"), cell_num(2), cell_num(k_layer),
                    cell_num(k_layer / GB), cell_num(L * k_layer / GB), cell_num(NAN), cell_num(NAN)};
    printer_row(p, krow);
    trainer_row(p, in, "this trainer, cpu device (fp32)", 4);
    trainer_row(p, in, "this trainer, cuda device (bf16)", 2);
    printer_table_end(p);

    GPTPlan plan = gpt_plan_whole(&in->layout, in->batch, in->seq_len);
    GPTActBytes cuda = gpt_activation_bytes(&in->layout, &plan, 2);
    printer_num(p, "trainer_cuda_over_korthikanti", "per layer, this trainer on cuda / Korthikanti",
                cuda.per_layer / k_layer, "%.2f", "x");
    printer_note(p, "Korthikanti et al. (2022), no recomputation: 34sbh bytes of 16-bit tensors and "
                    "dropout masks per layer, plus 5as^2b for the attention scores, softmax, its "
                    "dropout mask and output; saved total = L x per layer (no embedding or logits).");
    printer_note(p, "this trainer: activations are fp32 on the cpu device and bf16 on cuda; there is no "
                    "dropout, so no masks; the attention probabilities (B, a, T, T) are saved once, in fp32 "
                    "on both devices (Korthikanti: 2 + 1 + 2 bytes for softmax, mask, dropout output).");
    printer_note(p, "this trainer also saves the GELU input and output, the layernorm mean and rstd "
                    "(fp32, per token) and the residual stream; its saved total adds the embedding output, "
                    "the final layernorm, the logits (B, T, V, rows padded to a multiple of 64) and the token ids.");
    printer_note(p, "backward scratch and the fp32 gradient workspace of one unit are live during "
                    "backward only; they are counted by the trainers as workspace, not activations.");
    printer_section_end(p);
}
