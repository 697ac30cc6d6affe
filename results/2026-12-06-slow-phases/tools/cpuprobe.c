#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(void){
  size_t n=64<<20; char*a=malloc(n),*b=malloc(n); memset(a,1,n); memset(b,2,n);
  double t=now(); volatile unsigned long x=1; for(long i=0;i<200000000;i++){x=x*6364136223846793005UL+1442695040888963407UL;} double alu=now()-t;
  t=now(); for(int r=0;r<8;r++) memcpy(r&1?a:b, r&1?b:a, n); double mc=now()-t;
  char hot[32768]; char hot2[32768]; memset(hot,3,sizeof hot);
  t=now(); for(int r=0;r<200000;r++){ memcpy(hot2,hot,sizeof hot); __asm__ volatile(""::"r"(hot2):"memory"); } double hc=now()-t;
  printf("alu %.0f Mop/s  memcpy-cold %.0f MB/s  memcpy-hot %.0f MB/s\n", 200/alu, 8.0*n/mc/1e6, 200000.0*sizeof hot/hc/1e6);
}
