# cu2cpp.sed: CUDA C++ to plain C++ for the cuda emulator (make's emulator
# build runs it over each .cu file, after a #line naming the source).
# A launch  k<<<grid, block, shmem, stream>>>(args)  becomes
#   emu::launcher(__FILE__, __LINE__, "k", k, grid, block, shmem, stream)(args)
# and a template's  k<T, U><<<...>>>(args)  the same with "k<T, U>"
s/\([A-Za-z_][A-Za-z_0-9]*<[^<>]*>\)<<</emu::launcher(__FILE__, __LINE__, "\1", \1, /g
s/\([A-Za-z_][A-Za-z_0-9]*\)<<</emu::launcher(__FILE__, __LINE__, "\1", \1, /g
s/>>>(/)(/g
# __global__ void __launch_bounds__(N) k(  registers N for k's launches
s/^\(.*\)__global__ void __launch_bounds__(\([^)]*\)) \([A-Za-z_][A-Za-z_0-9]*\)(/static const int emu_bounds_\3 __attribute__((unused)) = emu::register_launch_bounds("\3", \2); \1__global__ void \3(/
# extern __shared__ [__align__(N)] T name[];  (the launch's dynamic shared memory) becomes
#   T *name = (T *)emu::dynamic_shared(__FILE__, __LINE__);
s/extern __shared__ \(__align__([0-9]*) \)\{0,1\}\([A-Za-z_][A-Za-z_0-9 ]*[A-Za-z_0-9]\) \([A-Za-z_][A-Za-z_0-9]*\)\[\];/\2 *\3 = (\2 *)emu::dynamic_shared(__FILE__, __LINE__);/
