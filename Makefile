# zero-workbench: `make` builds every stage; `make stage-NN` one of them.
# Libraries are found by compiling a small probe, not by asking a package
# manager, and each target asks only for what it needs: every binary Open
# MPI and OpenBLAS; stage 06 libaio; --deepspeed-config jansson (without it
# the binaries refuse that flag); make test cmocka, jansson and libaio. The
# cuda parts are built only where nvcc is found (GPU=0 skips them). `make`
# prints what it found and what it left out, a line per optional part.
# EMU=1 builds the cuda parts for the cuda emulator instead (tests/emu: g++
# and Boost.Context); make test does so in build-emu/ where no GPU is visible.

SHELL := /bin/bash
GPU ?= 1
BUILD := build$(if $(filter 0,$(GPU)),-nogpu)
# where the binaries go: the repository root, unless a build of its own
# (make sanitize) puts them elsewhere
BINDIR ?=
BIN_PREFIX := $(if $(BINDIR),$(BINDIR)/)
NP ?= 4
# every core builds, unless the command line says how many (make -jN); a
# make run by this one (the emulator's build) shares its jobs
ifeq ($(MAKELEVEL)$(filter -j%,$(MAKEFLAGS)),0)
MAKEFLAGS += -j$(shell nproc)
endif

# ---- probes ---------------------------------------------------------------
probe = $(shell bash scripts/probe.sh $(1))
, := ,

MPICC := $(shell command -v mpicc 2>/dev/null)
HAVE_MPI := $(if $(MPICC),$(call probe,mpi $(MPICC)))
BLAS_INC := $(firstword $(foreach d,/usr/include/x86_64-linux-gnu/openblas-pthread /usr/include/aarch64-linux-gnu/openblas-pthread /usr/include/openblas /usr/include,$(if $(wildcard $(d)/cblas.h),$(d))))
HAVE_BLAS := $(call probe,blas gcc -I$(BLAS_INC))
HAVE_AIO := $(call probe,aio gcc)
HAVE_CMOCKA := $(call probe,cmocka gcc)
HAVE_JANSSON := $(call probe,jansson gcc)
NVCC := $(if $(filter 1,$(GPU)),$(shell command -v nvcc 2>/dev/null))
CUDA_HOME ?= $(if $(NVCC),$(patsubst %/bin/nvcc,%,$(realpath $(NVCC))))
HAVE_NCCL := $(if $(NVCC),$(call probe,nccl gcc -I$(CUDA_HOME)/include -L$(CUDA_HOME)/lib64))
EMU ?= 0
MPICXX := $(shell command -v mpicxx 2>/dev/null)
HAVE_EMU := $(if $(MPICXX),$(call probe,boost_context $(MPICXX)))

# what every binary needs, and what single parts need besides
MISSING := $(strip $(if $(HAVE_MPI),,Open MPI) $(if $(HAVE_BLAS),,OpenBLAS))
MISSING_06 := $(if $(HAVE_AIO),,libaio)
MISSING_TEST := $(strip $(if $(HAVE_CMOCKA),,cmocka) $(if $(HAVE_JANSSON),,jansson) $(if $(HAVE_AIO),,libaio) \
                $(if $(HAVE_EMU),,Boost.Context and mpicxx (the cuda emulator)))
# a line per optional part: found, or what is left out without it
PARTS := libaio: $(if $(HAVE_AIO),found,not found: stage 06 (infinity) and the aio tests are left out);\
         jansson: $(if $(HAVE_JANSSON),found,not found: --deepspeed-config is refused$(,) --json records carry no settings);\
         cmocka: $(if $(HAVE_CMOCKA),found,not found: make test needs it);\
         cuda: $(if $(NVCC),found ($(NVCC)),left out ($(if $(filter 1,$(GPU)),nvcc not found,GPU=0)));\
         nccl: $(if $(HAVE_NCCL),found,left out$(if $(NVCC), (no nccl.h of NCCL 2.18 or newer)));\
         cuda emulator: $(if $(HAVE_EMU),found (make test runs the cuda tests on it where no GPU is visible),not found: make test needs Boost.Context and mpicxx)

# ---- flags ----------------------------------------------------------------
CC := $(if $(MPICC),$(MPICC),cc)
OPT ?= -O3 -march=native
# common/ is grouped by layer (runtime, device, comm, model, training); every
# folder is on the include path, so a stage includes "trainer.h" by name alone.
# The device's two backends sit a level deeper, each in a folder of its own
# under the interface (device.h, kernels.h), and so do the parts of the
# training that do not know the Trainer (checkpoints, configuration, the
# report), under the trainer that uses them; they are named here.
DEVICE_BACKEND_DIRS := common/device/cpu common/device/cuda
TRAINING_PART_DIRS := common/training/ckpt common/training/config common/training/report
COMMON_DIRS := $(patsubst %/,%,$(sort $(dir $(wildcard common/*/*)))) $(DEVICE_BACKEND_DIRS) $(TRAINING_PART_DIRS)
COMMON_INC := $(addprefix -I,$(COMMON_DIRS))
CFLAGS := $(OPT) -fno-math-errno -std=gnu11 -fopenmp -Wall -Wextra -Wno-unused-parameter $(COMMON_INC) -I$(BLAS_INC) -MMD -MP
LDLIBS := -lopenblas -lm -fopenmp $(if $(HAVE_JANSSON),-ljansson)
CFLAGS += $(if $(HAVE_JANSSON),-DWB_HAVE_JANSSON)
# sm_80 and sm_90, the visible GPU's own architecture, and PTX for newer ones
# (only a "major.minor" answer counts: a failing nvidia-smi prints prose)
GPU_ARCH := $(if $(NVCC),$(shell nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | grep -E '^[0-9]+\.[0-9]+$$' | head -1 | tr -d '.'))
CUDA_ARCHS ?= $(shell printf '%s\n' 80 90 $(GPU_ARCH) | sort -n -u)
ifneq ($(NVCC),)
  CFLAGS += -DWB_HAVE_CUDA -I$(CUDA_HOME)/include $(if $(HAVE_NCCL),-DWB_HAVE_NCCL)
  # -lineinfo: compute-sanitizer and the profilers name source lines; every
  # warning, nvcc's and the host compiler's, is an error
  NVFLAGS := -O3 -std=c++17 -lineinfo -Werror all-warnings -Xcompiler -Wall,-Wextra,-Wno-unused-parameter,-Werror \
             $(COMMON_INC) -DWB_HAVE_CUDA $(if $(HAVE_NCCL),-DWB_HAVE_NCCL) \
             $(foreach a,$(CUDA_ARCHS),-gencode arch=compute_$(a),code=sm_$(a)) \
             -gencode arch=compute_$(lastword $(CUDA_ARCHS)),code=compute_$(lastword $(CUDA_ARCHS)) -Xcompiler -fopenmp -MMD -MP
  LDLIBS += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublasLt -lcublas -lcudart $(if $(HAVE_NCCL),-lnccl) -lstdc++
endif
# The emulator build: the emulator's cuda_runtime.h, cublasLt.h and nccl.h
# stand in for the toolkit's; each .cu file is rewritten by cu2cpp.sed
# (launches) and compiled by g++ with cuda_runtime.h included first, as nvcc
# does; -g keeps the source lines the emulator's fault reports name.
ifeq ($(EMU),1)
  EMU_INC := -Itests/emu/include
  CFLAGS += -DWB_HAVE_CUDA -DWB_HAVE_NCCL -DWB_CUDA_EMU $(EMU_INC)
  EMU_CXXFLAGS := -O2 -gdwarf-4 -std=c++17 -fopenmp -DOMPI_SKIP_MPICXX -DWB_CUDA_EMU -Wall -Wextra -Wno-unused-parameter -Werror \
                  $(EMU_INC) -Itests/emu -I$(BLAS_INC) -MMD -MP
  EMU_LIB := $(BUILD)/libcudaemu.a
  LDLIBS += $(EMU_LIB) -lboost_context -ldl -lstdc++
endif

# ---- sources ----------------------------------------------------------------
# every folder of common/ holds sources; *_cuda.c, *_nccl.c and *.cu are the cuda parts.
COMMON_C_ALL := $(wildcard $(COMMON_DIRS:%=%/*.c))
COMMON_CU_ALL := $(wildcard $(COMMON_DIRS:%=%/*.cu))
CUDA_C_SRC := $(filter %_cuda.c %_nccl.c,$(COMMON_C_ALL))
# stage_main.c is every trainer's main(), compiled once per stage (below)
STAGE_MAIN := common/training/stage_main.c
# common/tools: programs of their own beside the trainers (ckpt_tool)
TOOL_SRC := $(wildcard common/tools/*.c)
# the DeepSpeed-config reader with jansson, or the refusal of the flag without it
DS_SRC := $(wildcard common/training/config/ds_config*.c)
DS_NONE := common/training/config/ds_config_none.c
DS_USED := $(if $(HAVE_JANSSON),$(filter-out $(DS_NONE),$(DS_SRC)),$(DS_NONE))
# the aio module: only stage 06 (and its tests and benchmarks) reads files with it
AIO_SRC := $(wildcard common/io/*.c)
COMMON_SRC := $(filter-out $(CUDA_C_SRC) $(STAGE_MAIN) $(TOOL_SRC) $(DS_SRC) $(if $(HAVE_AIO),,$(AIO_SRC)),$(COMMON_C_ALL)) \
              $(DS_USED)
COMMON_OBJ := $(COMMON_SRC:%.c=$(BUILD)/%.o)
# the kernels (kernels_cuda*.cu) twice: bf16 (*.o) and fp16 (*.fp16.o, WB_CUDA_FP16)
CUDA_KERNEL_SRC := $(wildcard common/device/cuda/kernels_cuda*.cu)
ifneq ($(NVCC)$(filter 1,$(EMU)),)
  COMMON_OBJ += $(CUDA_C_SRC:%.c=$(BUILD)/%.o) $(patsubst %.cu,$(BUILD)/%.o,$(COMMON_CU_ALL)) \
                $(patsubst %.cu,$(BUILD)/%.fp16.o,$(CUDA_KERNEL_SRC))
endif
LIB := $(BUILD)/libcommon.a

# stage NN: binary name and sources (later stages link the pieces they build on)
BIN_00 := memory_math
BIN_01 := dp_baseline
BIN_02 := zero1
BIN_03 := zero2
BIN_04 := zero3
BIN_05 := cpu_offload
BIN_06 := infinity
BIN_07 := 3d_parallel
# The stage graph, stated once: stage NN builds on stage BASE_NN (what
# `make diff-NN` diffs it against, scripts/stage-diff.sh), and links USES_NN,
# the files of earlier stages it calls; their folders are on its include path
# (STAGE_INC_NN), so a stage includes "grad_shard.h" by name.
BASE_02 := 01
BASE_03 := 02
BASE_04 := 03
BASE_05 := 03
BASE_06 := 04
BASE_07 := 02
USES_03 := 02_zero1/shard_update.c
USES_04 := 03_zero2/grad_shard.c 02_zero1/shard_update.c
USES_05 := 03_zero2/grad_shard.c 02_zero1/shard_update.c
USES_06 := 04_zero3/param_shard.c 04_zero3/zeropp.c 03_zero2/grad_shard.c 05_cpu_offload/host_grads.c
USES_07 := 02_zero1/shard_update.c
$(foreach n,01 02 03 04 05 06 07,$(eval SRC_$(n) := $(wildcard $(n)_*/*.c) $(USES_$(n))) \
    $(eval STAGE_INC_$(n) := $(addprefix -I,$(patsubst %/,%,$(sort $(dir $(USES_$(n))))))))
STAGE_IDS := 00 01 02 03 04 05 06 07
STAGES := $(foreach n,$(STAGE_IDS),$(if $(wildcard */$(BIN_$(n)).c),$(n)))
# stage 06 reads its files with libaio: without it `make` leaves it out and says so
BUILT_STAGES := $(filter-out $(if $(HAVE_AIO),,06),$(STAGES))
TRAINERS := $(filter-out 00,$(STAGES))
TOOLS := $(TOOL_SRC:common/tools/%.c=$(BIN_PREFIX)%)
BINS := $(foreach n,$(BUILT_STAGES),$(BIN_PREFIX)$(BIN_$(n))) $(TOOLS)
# memory_math reads what each stage keeps and its buffers from mem_math's tables
SRC_00 := $(wildcard 00_memory_math/*.c)
# a trainer's main: stage_main.c naming its strategy, strategy_<binary>
MAIN_OBJ = $(BUILD)/main/$(1).o

# tests/core: the core's units; tests/tp: tensor parallelism; tests/stages:
# whole trainers run as programs; tests/labs: the lab kit and its planted
# mistakes (a lab's copy leaves that folder out: it holds the answers);
# tests/lib: what they share
TEST_SRC := $(wildcard tests/core/test_*.c tests/tp/test_*.c tests/stages/test_*.c tests/labs/test_*.c)
TEST_BINS := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
# the cuda tests, and the cuda emulator's own (make test: below)
CUDA_TEST_SRC := $(wildcard tests/*/test_cuda*.c)
EMU_TEST_SRC := $(CUDA_TEST_SRC) $(wildcard tests/emu/test_*.c)
EMU_TEST_BINS := $(EMU_TEST_SRC:tests/%.c=build-emu/tests/%)

.PHONY: all deps check-deps check-deps-06 check-deps-test demo test emu sanitize sanitize-cuda fuzz bench bench-cuda bench-compare clean help lab-% check-lab-% grade-lab-% $(addprefix stage-,$(STAGES)) $(addprefix diff-,$(STAGES))
# With nvcc, the wmma cases the emulator runs (tests/emu/emu_wmma.cu) are
# compiled for the GPUs too: the subset of nvcuda::wmma that the emulator's
# mma.h gives is the toolkit's own.
WMMA_CHECK := $(if $(NVCC),$(BUILD)/tests/emu/emu_wmma.o)
all: check-deps $(BINS) $(WMMA_CHECK)
	@echo "built: $(BINS)"
	@printf '%s\n' "$(PARTS)" | tr ';' '\n' | sed 's/^ */  /' 

help:
	@echo "make            build every stage (binaries at the repository root)"
	@echo "make stage-NN   build one stage (00 memory_math, 01 dp_baseline, 02 zero1, 03 zero2, 04 zero3, 05 cpu_offload, 06 infinity, 07 3d_parallel)"
	@echo "make deps       install the Debian packages the project needs"
	@echo "make demo       install, build, run every stage on the same model with NP=$(NP) ranks, side by side"
	@echo "make test       build and run the tests; ends with 'N passed, N failed'"
	@echo "make emu        the cuda emulator's build (build-emu/): the trainers run --device cuda on the CPU"
	@echo "make sanitize   the tests against an ASan + UBSan build (build-sanitize/); fails on any report"
	@echo "make sanitize-cuda  compute-sanitizer (memcheck, initcheck, racecheck, synccheck) over the cuda tests and stages, on a GPU"
	@echo "make fuzz       each libFuzzer target for FUZZ_SECONDS (default 30) from its corpus; fails on any finding"
	@echo "make bench      benchmarks, JSON in build/bench/ (with the cuda part where a GPU is usable)"
	@echo "make bench-cuda the cuda part alone: dp_baseline gpt2-124m beside PyTorch (eager, torch.compile), time per kernel"
	@echo "make bench-compare BASE=old.json [NEW=new.json]  two bench results side by side; exit 1 on a regression"
	@echo "make diff-NN    what stage NN adds over the stage before it"
	@echo "make lab-NN     a student copy (labs/NN, or LAB_DIR=...) with stage NN's technique to write"
	@echo "make check-lab-NN  (in that copy) build it and grade it: pass/fail per check and a score"
	@echo "make grade-lab-NN SUBMISSION=DIR  (in this tree) grade a student's copy with this tree's checks and figures"
	@echo "make GPU=0      leave the cuda parts out"

check-deps:
	@if [ -n "$(MISSING)" ]; then echo "missing: $(MISSING), which every binary needs; run 'make deps' (installs the Debian packages)"; exit 2; fi
check-deps-06: check-deps
	@if [ -n "$(MISSING_06)" ]; then echo "missing: libaio, which stage 06 (infinity) needs; run 'make deps'"; exit 2; fi
check-deps-test: check-deps
	@if [ -n "$(MISSING_TEST)" ]; then echo "missing: $(MISSING_TEST), which make test needs; run 'make deps'"; exit 2; fi

deps:
	@bash scripts/install-deps.sh

# (OPT at the link too: a sanitizer's runtime is linked by the flag that asks for it)
$(foreach n,$(STAGES),$(eval stage-$(n): check-deps $(if $(filter 06,$(n)),check-deps-06) $(BIN_PREFIX)$(BIN_$(n))))
$(BIN_PREFIX)$(BIN_00): $(SRC_00:%.c=$(BUILD)/%.o) $(LIB)
	$(CC) $(OPT) $^ -o $@ $(LDLIBS)
$(foreach n,$(TRAINERS),$(eval $(BIN_PREFIX)$(BIN_$(n)): $(call MAIN_OBJ,$(BIN_$(n))) $(SRC_$(n):%.c=$(BUILD)/%.o) $(LIB) ; $$(CC) $$(OPT) $$^ -o $$@ $$(LDLIBS) $(if $(filter 06,$(n)),-laio)))

$(TOOLS): $(BIN_PREFIX)%: $(BUILD)/common/tools/%.o $(LIB)
	$(CC) $(OPT) $^ -o $@ $(LDLIBS)

$(BUILD)/main/%.o: $(STAGE_MAIN)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -DSTAGE_STRATEGY=strategy_$* -c $< -o $@

$(LIB): $(COMMON_OBJ)
	@rm -f $@
	ar rcs $@ $^

# a stage's objects see the folders of the earlier stages it links (USES_NN)
$(foreach n,01 02 03 04 05 06 07,$(eval $(BUILD)/$(n)_%.o: CFLAGS += $(STAGE_INC_$(n))))
$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

# the DeepSpeed config reader names the stages this tree has (a config for
# one it lacks says so); it is rebuilt when that list changes here
$(BUILD)/common/training/config/ds_config.o: CFLAGS += -DWB_BUILT_STAGES='"$(BUILT_STAGES)"'
$(BUILD)/common/training/config/ds_config.o: Makefile

# the CPU Adam's scalar path stays scalar: it is the reference the SIMD paths
# are measured against, so the compiler must not vectorize it on its own
# (clang, which make fuzz builds with, names the switches otherwise)
NO_VECTORIZE := $(if $(shell $(CC) --version 2>/dev/null | grep -i clang),-fno-vectorize -fno-slp-vectorize,\
                -fno-tree-loop-vectorize -fno-tree-slp-vectorize)
$(BUILD)/common/device/cpu_adam_scalar.o: CFLAGS += $(NO_VECTORIZE)

ifeq ($(EMU),1)
$(BUILD)/%.o: %.cu tests/emu/cu2cpp.sed
	@mkdir -p $(dir $@)
	@(echo '#line 1 "$<"'; sed -f tests/emu/cu2cpp.sed $<) > $(BUILD)/$*.cu.cpp
	$(MPICXX) $(EMU_CXXFLAGS) $(COMMON_INC) -include cuda_runtime.h -D__CUDACC__ -DWB_HAVE_CUDA -DWB_HAVE_NCCL \
		-c -x c++ $(BUILD)/$*.cu.cpp -o $@
$(BUILD)/%.fp16.o: %.cu tests/emu/cu2cpp.sed
	@mkdir -p $(dir $@)
	@(echo '#line 1 "$<"'; sed -f tests/emu/cu2cpp.sed $<) > $(BUILD)/$*.fp16.cu.cpp
	$(MPICXX) $(EMU_CXXFLAGS) $(COMMON_INC) -include cuda_runtime.h -D__CUDACC__ -DWB_HAVE_CUDA -DWB_HAVE_NCCL \
		-DWB_CUDA_FP16 -c -x c++ $(BUILD)/$*.fp16.cu.cpp -o $@
$(BUILD)/emu/%.o: tests/emu/%.cpp
	@mkdir -p $(dir $@)
	$(MPICXX) $(EMU_CXXFLAGS) -c $< -o $@
$(EMU_LIB): $(patsubst tests/emu/%.cpp,$(BUILD)/emu/%.o,$(wildcard tests/emu/*.cpp))
	@rm -f $@
	ar rcs $@ $^
$(BINS) $(TEST_BINS) $(EMU_TEST_BINS): $(EMU_LIB)
# the emulator's fault cases (tests/emu/emu_faults.cu) and its nvcuda::wmma
# at work (tests/emu/emu_wmma.cu), for tests/emu/test_emu.c
$(BUILD)/tests/emu/emu_faults $(BUILD)/tests/emu/emu_wmma: $(BUILD)/tests/emu/%: $(BUILD)/tests/emu/%.o $(EMU_LIB)
	$(MPICXX) -fopenmp $^ -o $@ -lopenblas -lboost_context -ldl
else
$(BUILD)/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -c $< -o $@
$(BUILD)/%.fp16.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -DWB_CUDA_FP16 -c $< -o $@
endif

# tests link the core; tests of whole stages run the binaries
$(BUILD)/tests/%: tests/%.c $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests/lib $< $(LIB) -o $@ -lcmocka $(LDLIBS) -laio -ljansson

# test_kernels_isa: the cpu kernels that sum along rows (kernels_cpu.c,
# kernels_cpu_attention.c) built again at three vector widths, each copy's
# entry points renamed: scalar (no OpenMP, no vectorizer; FMA as the others
# have it), AVX2 (8 float lanes) and AVX-512 (16); their bits must agree
ISA_COPIES := scalar v3 v4
ISA_SRC := common/device/cpu/kernels_cpu.c common/device/cpu/kernels_cpu_attention.c
ISA_OPT_scalar := -O3 -march=x86-64-v3 -fno-tree-vectorize -fno-tree-slp-vectorize -Wno-unknown-pragmas
ISA_OPT_v3 := -O3 -march=x86-64-v3 -fopenmp
ISA_OPT_v4 := -O3 -march=x86-64-v4 -mprefer-vector-width=512 -fopenmp
ISA_RENAMED := kernels_cpu half_to_f32_cpu wte_backward_by_token_cpu wpe_backward_cpu attention_forward_cpu \
               attention_backward_cpu attention_cpu_scratch_bytes
define isa_copy
$(BUILD)/tests/core/isa_$(1)_$(notdir $(2:.c=.o)): $(2)
	@mkdir -p $$(dir $$@)
	$$(CC) $$(filter-out $$(OPT) -fopenmp,$$(CFLAGS)) $$(ISA_OPT_$(1)) $$(foreach f,$$(ISA_RENAMED),-D$$(f)=$$(f)_$(1)) \
		-c $$< -o $$@
endef
$(foreach c,$(ISA_COPIES),$(foreach f,$(ISA_SRC),$(eval $(call isa_copy,$(c),$(f)))))
ISA_OBJ := $(foreach c,$(ISA_COPIES),$(foreach f,$(ISA_SRC),$(BUILD)/tests/core/isa_$(c)_$(notdir $(f:.c=.o))))
$(BUILD)/tests/core/test_kernels_isa: tests/core/test_kernels_isa.c $(ISA_OBJ) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests/lib $< $(filter %.o,$^) $(LIB) -o $@ -lcmocka $(LDLIBS) -laio -ljansson

# test_flash: the cpu FlashAttention kernel built again with one bug of
# tests/core/flash_plants.h planted in each copy, its entry points renamed
FLASH_PLANTS := running_max rescale mask
$(BUILD)/tests/core/flash_plant_%.o: common/device/cpu/kernels_cpu_flash.c tests/core/flash_plants.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -include tests/core/flash_plants.h -DFLASH_PLANT_$* \
		-Dflash_attention_forward_cpu=flash_forward_plant_$* -Dflash_attention_backward_cpu=flash_backward_plant_$* \
		-Dflash_cpu_scratch_bytes=flash_scratch_plant_$* -Dflash_block_forward_cpu=flash_block_forward_plant_$* \
		-Dflash_block_backward_cpu=flash_block_backward_plant_$* \
		-c $< -o $@
$(BUILD)/tests/core/test_flash: tests/core/test_flash.c $(FLASH_PLANTS:%=$(BUILD)/tests/core/flash_plant_%.o) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests/lib $< $(filter %.o,$^) $(LIB) -o $@ -lcmocka $(LDLIBS) -laio -ljansson

# test_protocol runs dp_baseline planted with a mistake about the pass it
# is handed (tests/stages/planted_pass.c), one binary per mistake
PASS_PLANTS := 1 2
$(BUILD)/tests/plants/main.o: $(STAGE_MAIN)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -DSTAGE_STRATEGY=strategy_planted -c $< -o $@
$(BUILD)/tests/plants/pass_%.o: tests/stages/planted_pass.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -DPLANT=$* -c $< -o $@
$(BUILD)/tests/stages/planted_pass_%: $(BUILD)/tests/plants/pass_%.o $(BUILD)/tests/plants/main.o $(LIB)
	$(CC) $(OPT) $^ -o $@ $(LDLIBS)
$(BUILD)/tests/stages/test_protocol: $(PASS_PLANTS:%=$(BUILD)/tests/stages/planted_pass_%)
.SECONDARY: $(PASS_PLANTS:%=$(BUILD)/tests/plants/pass_%.o)

# test_step_memory runs zero3 planted with a mistake about when memory is
# held (tests/stages/timeline_plants.c), one binary per mistake: the model's
# holding (gpt_held.c), the formula's timeline (step_memory.c) or the budget
# check (trainer_budget.c) built again with one call standing for the
# planted one
TIMELINE_PLANTS := late label window bytes
PLANT_SRC_late := common/model/gpt_held.c
PLANT_SRC_label := common/model/gpt_held.c
PLANT_SRC_window := common/model/step_memory.c
PLANT_SRC_bytes := common/training/trainer_budget.c
PLANT_CALL_late := -Dbuf_free=planted_buf_free
PLANT_CALL_label := -Dbuf_alloc=planted_buf_alloc
PLANT_CALL_window := -Dzero_live_bytes=planted_zero_live_bytes
PLANT_CALL_bytes := -Drun_fits=planted_run_fits
$(foreach p,$(TIMELINE_PLANTS),$(eval $(BUILD)/tests/plants/held_$(p).o: $(PLANT_SRC_$(p)) ; \
    @mkdir -p $$(dir $$@) && $$(CC) $$(CFLAGS) $(PLANT_CALL_$(p)) -c $$< -o $$@))
$(BUILD)/tests/plants/timeline_%.o: tests/stages/timeline_plants.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -DTIMELINE_PLANT_$* -c $< -o $@
$(BUILD)/tests/stages/planted_timeline_%: $(BUILD)/tests/plants/held_%.o $(BUILD)/tests/plants/timeline_%.o \
        $(call MAIN_OBJ,zero3) $(SRC_04:%.c=$(BUILD)/%.o) $(LIB)
	$(CC) $(OPT) $^ -o $@ $(LDLIBS)
$(BUILD)/tests/stages/test_step_memory: $(TIMELINE_PLANTS:%=$(BUILD)/tests/stages/planted_timeline_%)
$(BUILD)/tests/stages/test_budget $(BUILD)/tests/stages/test_memory_timeline: \
        $(BUILD)/tests/stages/planted_timeline_bytes
.SECONDARY: $(TIMELINE_PLANTS:%=$(BUILD)/tests/plants/held_%.o) $(TIMELINE_PLANTS:%=$(BUILD)/tests/plants/timeline_%.o)

# test_training runs dp_baseline built with comm_world.c's read of a
# sibling's memory refused, as in a container that forbids it
# (tests/stages/copy_plant.c)
$(BUILD)/tests/plants/comm_world_denied.o: common/comm/comm_world.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Dprocess_vm_readv=planted_process_vm_readv -c $< -o $@
$(BUILD)/tests/plants/copy_plant.o: tests/stages/copy_plant.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@
$(BUILD)/tests/stages/planted_copy_denied: $(BUILD)/tests/plants/comm_world_denied.o $(BUILD)/tests/plants/copy_plant.o \
        $(call MAIN_OBJ,dp_baseline) $(SRC_01:%.c=$(BUILD)/%.o) $(LIB)
	$(CC) $(OPT) $^ -o $@ $(LDLIBS)
$(BUILD)/tests/stages/test_training: $(BUILD)/tests/stages/planted_copy_denied

# test_blas_core preloads a shim between the trainers and OpenBLAS (built
# without OPT's sanitizers: it is loaded into every process of the run)
$(BUILD)/tests/stages/test_blas_core: $(BUILD)/tests/lib/blas_shim.so
$(BUILD)/tests/lib/blas_shim.so: tests/lib/blas_shim.c
	@mkdir -p $(dir $@)
	gcc -O2 -shared -fPIC -I$(BLAS_INC) $< -o $@ -lopenblas -ldl

# benchmarks built against the core (bench/*.sh build and run them)
# (swap_pipeline drives stage 06's swapper: it links that file too)
$(BUILD)/bench/swap_pipeline: bench/swap_pipeline.c 06_infinity/swapper.c $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -I06_infinity $< 06_infinity/swapper.c $(LIB) -o $@ $(LDLIBS) -laio
$(BUILD)/bench/%: bench/%.c $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $< $(LIB) -o $@ $(LDLIBS) -laio

# Where no GPU is visible the cuda tests run on the cuda emulator instead of
# skipping: the emulator's build of the trainers and of those tests
# (build-emu/, EMU=1), run from build-emu/root beside links to the tree;
# tests/emu/ holds the emulator's own tests (what it must catch).
ON_EMU := $(if $(GPU_ARCH),,1)
TEST_RUN := $(if $(ON_EMU),$(filter-out $(CUDA_TEST_SRC:tests/%.c=$(BUILD)/tests/%),$(TEST_BINS)) $(EMU_TEST_BINS),$(TEST_BINS))
# (the tests run one at a time, and the makes they run get no jobserver of ours)
test: check-deps-test all $(TEST_BINS) $(if $(ON_EMU),emu)
	@env -u MAKEFLAGS -u MFLAGS bash tests/run.sh $(TEST_RUN)

# the emulator's build: every trainer, the cuda tests and the emulator's own
emu: check-deps-test
	@mkdir -p build-emu/root
	@$(MAKE) --no-print-directory GPU=0 EMU=1 BUILD=build-emu BINDIR=build-emu/root \
		all $(EMU_TEST_BINS) build-emu/tests/emu/emu_faults build-emu/tests/emu/emu_wmma

# libFuzzer targets (tests/fuzz/fuzz_*.c: the data readers, the checkpoint
# reader, the flag parser), each with ASan and UBSan, built with clang (mpicc
# told to use it) over a core built the same way in build-fuzz/; each runs
# FUZZ_SECONDS from its seed corpus (tests/fuzz/corpus/NAME), which also
# holds every input that once found a bug (scripts/fuzz.sh).
FUZZ_SECONDS ?= 30
FUZZ_OPT := -O1 -g -fno-omit-frame-pointer -fsanitize=fuzzer-no-link,address,undefined,float-cast-overflow \
            -fno-sanitize-recover=all
FUZZ_NAMES := $(patsubst tests/fuzz/%.c,%,$(wildcard tests/fuzz/fuzz_*.c))
fuzz:
	@command -v clang >/dev/null && [ -e "$$(clang -print-file-name=libclang_rt.fuzzer-x86_64.a)" ] || \
		bash scripts/install-deps.sh fuzz
	@OMPI_CC=clang $(MAKE) --no-print-directory GPU=0 BUILD=build-fuzz OPT='$(FUZZ_OPT)' \
		$(FUZZ_NAMES:%=build-fuzz/fuzz/%)
	@bash scripts/fuzz.sh build-fuzz $(FUZZ_SECONDS) $(FUZZ_NAMES)

# the config reader's refusal exits; its target links it to a function that returns to the fuzzer
$(BUILD)/fuzz/fuzz_ds_config: LDLIBS += -Wl,--wrap=fail_usage
$(BUILD)/fuzz/%: tests/fuzz/%.c $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -fsanitize=fuzzer $< $(LIB) -o $@ $(LDLIBS)

# The test suite against a build with AddressSanitizer and UndefinedBehavior-
# Sanitizer (float-cast-overflow too, which -fsanitize=undefined leaves out),
# on the cpu device, in build-sanitize/ so that the normal build stays: its
# binaries go to build-sanitize/root beside links to the rest of the tree.
# Any report fails it (scripts/sanitize.sh).
SANITIZE_OPT := -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined,float-cast-overflow -fno-sanitize-recover=all
sanitize:
	@mkdir -p build-sanitize/root
	@$(MAKE) --no-print-directory GPU=0 BUILD=build-sanitize BINDIR=build-sanitize/root OPT='$(SANITIZE_OPT)' \
		all $(TEST_SRC:tests/%.c=build-sanitize/tests/%)
	@bash scripts/sanitize.sh build-sanitize

# compute-sanitizer's four tools over the cuda tests and every stage, where a
# GPU is visible (scripts/sanitize_cuda.sh); one line and exit 0 where not
sanitize-cuda: all $(CUDA_TEST_SRC:tests/%.c=$(BUILD)/tests/%)
	@bash scripts/sanitize_cuda.sh

bench: all
	@bash bench/run.sh

bench-cuda: all
	@bash bench/cuda.sh

# make bench-compare BASE=old.json [NEW=new.json]: exit 1 on a regression
bench-compare:
	@if [ -z "$(BASE)" ]; then echo "bench-compare: give BASE=results.json of an earlier make bench (NEW defaults to build/bench/results.json)"; exit 2; fi
	@python3 bench/compare.py $(BASE) $(NEW)

demo:
	@bash scripts/demo.sh $(NP)

$(foreach n,$(STAGES),$(eval diff-$(n): ; @bash scripts/stage-diff.sh $(n) $(BASE_$(n))))

# course labs: a student copy with stage NN's technique stubbed out, and its checks
# (LAB_DIR reaches make_lab.py as SUBMISSION reaches grade_lab.py, below)
LAB_DIR ?=
unexport LAB_DIR
lab-%: export ZW_LAB_DIR = $(value LAB_DIR)
lab-%: all
	@python3 scripts/make_lab.py $*
check-lab-%:
	@python3 scripts/check_lab.py $*
# a student's copy graded by the reference: only the lab's files are taken from it.
# SUBMISSION reaches grade_lab.py as typed, in the environment: make exports
# a variable expanded ($ in a path would be make's), and a shell line would
# read it again; value() is the text as given, and no shell sees it.
SUBMISSION ?=
unexport SUBMISSION
grade-lab-%: export ZW_SUBMISSION = $(value SUBMISSION)
grade-lab-%:
	@python3 scripts/grade_lab.py $*

clean:
	rm -rf $(BUILD) build-emu $(foreach n,$(STAGE_IDS),$(BIN_$(n))) $(TOOLS)

# The compiler writes the dependency files; no rule makes them (else, when
# one is older than its source, make chains its built-in rules into
# compiling a "NAME.d.o" to remake it, and the build fails)
%.d: ;
-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
