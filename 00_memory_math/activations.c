// activations.c: memory_math's activation section: for each --recompute mode,
// Korthikanti et al.'s per-layer figure beside what this trainer saves for
// backward and recomputes (act_math.c's closed forms), for one micro-batch of
// B sequences of T tokens, and what recomputing costs in FLOPs.
#include <math.h>
#include "act_math.h"
#include "memory_math.h"

#define GB 1e9

static const Col act_cols[] = {
    {"recompute", "recompute", 9, NULL},
    {"what", "what", 38, NULL},
    {"bytes_per_element", "B/elem", 6, "%.0f"},
    {"per_layer_bytes", "per layer bytes", 15, PRINT_GROUPED},
    {"saved_gb", "saved GB", 10, "%.3f"},
    {"working_gb", "working GB", 10, "%.3f"},
    {"host_gb", "host GB", 8, "%.3f"},
    {"extra_flops", "+FLOPs", 7, "%.3f"},
};

static void trainer_row(Printer *p, const Inputs *in, GPTRecompute r, int offload, const char *what, int act_bytes) {
    GPTPlan plan = act_plan(in, r, offload);
    ActFormula a = act_formula(act_layout(in), &plan, act_bytes);
    double extra = (recompute_flops_per_token(&in->layout, in->seq_len, r, in->attention, in->tiled_mlp) +
                    tiled_mlp_flops_per_token(&in->layout, in->tiled_mlp) +
                    tiled_loss_flops_per_token(&in->layout, in->tiled_loss)) /
                   gpt_flops_per_token(&in->layout, in->seq_len);
    Cell row[8] = {cell_str(offload ? "full+host" : gpt_recompute_name(r)), cell_str(what), cell_num(act_bytes),
                   cell_num(a.per_layer), cell_num(a.saved / GB), cell_num(a.working / GB),
                   cell_num(a.offloaded / GB), cell_num(extra)};
    printer_row(p, row);
}

void section_activations(Printer *p, const Inputs *in) {
    const GPTConfig *c = &in->layout.cfg;
    // s: a rank's positions of a sequence (under --cp, S/C of them)
    double s = in->seq_len / (in->cp > 1 ? in->cp : 1), b = in->batch, h = c->channels, a = c->num_heads;
    double L = c->num_layers, t = in->tp;
    int sp = in->tp > 1 && in->sequence_parallel;
    printer_section(p, "activations",
                    "Activations of one micro-batch per rank by --recompute mode, computed from the formulas");
    printer_num(p, "layers", "L (layers)", L, "%.0f", NULL);
    printer_num(p, "heads", "a (heads)", a, "%.0f", NULL);
    printer_num(p, "hidden", "h (channels)", h, "%.0f", NULL);
    printer_num(p, "vocab", "V (vocabulary)", c->vocab_size, "%.0f", NULL);
    printer_num(p, "vocab_padded", "Vp (V rounded up to 128: wte's rows, the logits' columns)",
                gpt_vocab_padded(c->vocab_size, 1), "%.0f", NULL);
    printer_num(p, "context", "context (wpe rows)", c->max_seq_len, "%.0f", NULL);
    printer_str(p, "recompute", "recompute (the run's, in the fit tables)", gpt_recompute_name(in->recompute));
    printer_str(p, "attention", "attention (the run's, in every row)", gpt_attention_name(in->attention));
    printer_num(p, "tp", "t (tensor-parallel ranks; per rank below)", t, "%.0f", NULL);
    if (in->cp > 1)
        printer_num(p, "cp", in->cp_ring ? "c (context-parallel ranks, ring: s = T/c positions per rank below, two chunks)"
                                         : "c (context-parallel ranks, Ulysses: s = T/c positions per rank below)",
                    in->cp, "%.0f", NULL);
    if (in->tp > 1)
        printer_str(p, "tp_split", "between the tensor-parallel regions",
                    sp ? "split over the t ranks (--sequence-parallel)" : "whole on every rank");

    // the head's logits (every row below holds them, by the run's --tiled-loss), counted on cuda (bf16)
    double Vp = gpt_logits_stride(act_layout(in)), chunk = in->tiled_loss ? act_tile_tokens(s * b, in->tiled_loss) : s * b;
    printer_num(p, "tiled_loss", "--tiled-loss (chunks of a micro-batch's tokens; 0: the logits whole)", in->tiled_loss,
                "%.0f", NULL);
    printer_num(p, "logits_bytes_cuda", in->tiled_loss ? "logits live at once on cuda: one chunk of ceil(sb/K) tokens, rounded up to 16, ·Vp·e, e = 2"
                                                       : "logits of a micro-batch on cuda: sb·Vp·e, e = 2",
                chunk * Vp * 2, "%.0f", "bytes");

    printer_table(p, "rows", act_cols, 8);
    for (int r = GPT_RECOMPUTE_NONE; r <= GPT_RECOMPUTE_FULL; r++) {
        double k = korthikanti_bytes((GPTRecompute)r, s, b, h, a, t, sp);
        char what[64];
        snprintf(what, sizeof what, "Korthikanti %s", korthikanti_text((GPTRecompute)r, in->tp, sp));
        Cell krow[8] = {cell_str(gpt_recompute_name((GPTRecompute)r)), cell_str(what), cell_num(2), cell_num(k),
                        cell_num(L * k / GB), cell_num(NAN), cell_num(NAN), cell_num(NAN)};
        printer_row(p, krow);
        trainer_row(p, in, (GPTRecompute)r, 0, "this trainer, cpu device (fp32)", 4);
        trainer_row(p, in, (GPTRecompute)r, 0, "this trainer, cuda device (bf16)", 2);
    }
    trainer_row(p, in, GPT_RECOMPUTE_FULL, 1, "this trainer, cpu, inputs on the host", 4);
    trainer_row(p, in, GPT_RECOMPUTE_FULL, 1, "this trainer, cuda, inputs on the host", 2);
    printer_table_end(p);

    GPTPlan none = act_plan(in, GPT_RECOMPUTE_NONE, 0), mine = act_plan(in, in->recompute, in->offload_activations);
    ActFormula an = act_formula(act_layout(in), &none, 2), am = act_formula(act_layout(in), &mine, 2);
    printer_num(p, "trainer_cuda_over_korthikanti", "per layer without recompute, this trainer on cuda / Korthikanti",
                an.per_layer / korthikanti_bytes(GPT_RECOMPUTE_NONE, s, b, h, a, t, sp), "%.2f", "x");
    printer_num(p, "saved_fraction", "saved + working with the run's --recompute / without (cuda)",
                (am.saved + am.working) / an.saved, "%.3f", NULL);
    printer_note(p, "Korthikanti et al. (2022), Table 2, 16-bit: no recompute 34sbh per layer of tensors and "
                    "dropout masks plus 5as^2b for the attention scores, softmax, its dropout mask and output; "
                    "selective drops the 5as^2b (recomputed); full keeps the layer's input, 2sbh. Saved = L x "
                    "per layer (no embedding or logits).");
    int flash = in->attention == GPT_ATTENTION_FLASH;
    printer_note(p, "this trainer per layer (--attention %s): none %s; selective %s (working set %s); full %s "
                    "(working set %s); e = 4 bytes on the cpu device, 2 on cuda; no dropout, so no masks; fp32 %s "
                    "and layernorm statistics.", gpt_attention_name(in->attention),
                 act_formula_layer_text(GPT_RECOMPUTE_NONE, sp, flash),
                 act_formula_layer_text(GPT_RECOMPUTE_SELECTIVE, sp, flash),
                 act_formula_working_text(GPT_RECOMPUTE_SELECTIVE, sp, flash),
                 act_formula_layer_text(GPT_RECOMPUTE_FULL, sp, flash),
                 act_formula_working_text(GPT_RECOMPUTE_FULL, sp, flash),
                 flash ? "log-sum-exp of each attention row (4asb: FlashAttention keeps no (T,T) matrix, so "
                         "selective recompute has nothing to drop)"
                       : "attention probabilities (4as^2b)");
    if (in->tp > 1)
        printer_note(p, "with --tp %d the figures are one tensor-parallel rank's (3d_parallel --tp %d, pp 1): its "
                        "heads' qkv, attention and MLP tensors; the rest %s%s.", in->tp, in->tp,
                     sp ? "split by the tokens (sequence parallel), with a gathered (BT,C) and a scattered "
                          "(BT/t,C) temporary" : "whole on every rank",
                     in->partition_activations ? "; full recompute's saved inputs 1/t each (partitioned)" : "");
    printer_note(p, "full+host (--offload-activations, ZeRO-R's CPU checkpointing): every block's input but the "
                    "first's in pinned host memory, (L - 1) sbhe (host GB); the device keeps a ring of two, "
                    "2 sbhe, and the copies move (L - 1) sbhe down in forward and back in backward per micro-batch.");
    printer_note(p, "saved adds the embedding output, the final layernorm, the logits (B, T, V, rows padded to a "
                    "multiple of 64), the token ids with their buckets (the positions sorted by token, 8sb) and "
                    "one projection temporary; working is the one block's tensors that are recomputed before its "
                    "backward, shared by every block.");
    printer_note(p, "+FLOPs: recomputation over the model FLOPs (6 Psi_matmul + 12 L C T per token): selective "
                    "the materialized attention forward again, L x 4CT (0 with flash, which keeps no "
                    "probabilities); full the block forward but its MLP projection, L x (16C^2 + 4CT). Hardware "
                    "FLOPs = model FLOPs x (1 + that).");
    printer_note(p, "backward scratch and the fp32 gradient workspace of one unit are live during backward "
                    "only; they are counted by the trainers as workspace, not activations.");
    printer_section_end(p);
}
