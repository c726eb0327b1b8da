#!/usr/bin/env bash
# probe.sh NAME [COMPILER] [FLAGS...]: compiles and links a small program that
# uses library NAME; prints 1 when it builds. The Makefile's way of finding
# libraries without asking a package manager.
name=$1; cc=${2:-cc}; shift 2 2>/dev/null; flags=("$@")
case $name in
  mpi)    src='#include <mpi.h>
int main(void){MPI_Init(0,0);return MPI_Finalize();}'; libs=();;
  blas)   src='#include <cblas.h>
int main(void){openblas_set_num_threads(1);float a=1;cblas_sgemm(CblasRowMajor,CblasNoTrans,CblasNoTrans,1,1,1,1.f,&a,1,&a,1,0.f,&a,1);return 0;}'; libs=(-lopenblas);;
  aio)    src='#include <libaio.h>
int main(void){io_context_t c=0;return io_setup(1,&c);}'; libs=(-laio);;
  cmocka) src='#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
int main(void){return 0;}'; libs=(-lcmocka);;
  jansson) src='#include <jansson.h>
int main(void){json_error_t e;json_t *j=json_loads("{}",0,&e);json_decref(j);return 0;}'; libs=(-ljansson);;
  nccl)   src='#include <nccl.h>
#if NCCL_VERSION_CODE < NCCL_VERSION(2, 18, 0)
#error "ncclCommSplit needs NCCL 2.18 or newer"
#endif
int main(void){int v;return ncclGetVersion(&v);}'; libs=(-lnccl -lcudart);;
  boost_context) lang=c++; src='#include <boost/context/fiber.hpp>
int main(){boost::context::fiber f([](boost::context::fiber &&m){return std::move(m);});f=std::move(f).resume();return 0;}'; libs=(-lboost_context);;
  *) exit 0;;
esac
printf '%s\n' "$src" | $cc -x "${lang:-c}" - -o /dev/null "${flags[@]}" "${libs[@]}" >/dev/null 2>&1 && echo 1
exit 0
