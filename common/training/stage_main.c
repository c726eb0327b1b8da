// stage_main.c: the main() of every trainer. The Makefile compiles this file
// once per stage with STAGE_STRATEGY naming the stage's strategy (for example
// -DSTAGE_STRATEGY=strategy_zero2), so a stage's own file holds only its
// technique, and memory_math can link every stage's strategy to read what
// each one keeps.
#include "trainer.h"

#ifndef STAGE_STRATEGY
#error "compile with -DSTAGE_STRATEGY=strategy_<stage>"
#endif

extern const Strategy STAGE_STRATEGY;

int main(int argc, char **argv) { return trainer_main(argc, argv, &STAGE_STRATEGY); }
