#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <immintrin.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static void ntcopy(char*d,const char*s,size_t n){
  while(((size_t)d&63)&&n){*d++=*s++;n--;}
  for(;n>=64;n-=64,d+=64,s+=64){__m512i v=_mm512_loadu_si512((const void*)s);_mm512_stream_si512((void*)d,v);}
  memcpy(d,s,n); _mm_sfence();
}
int main(int argc,char**argv){
  size_t tpool=(size_t)atol(argv[1])<<20; int nt=atoi(argv[2]); size_t n=65000;
  char*src=aligned_alloc(4096,1<<20); char*dst=aligned_alloc(4096,tpool+65536);
  memset(src,1,1<<20); memset(dst,2,tpool+65536);
  size_t ndg=tpool/n; double t0=now(); size_t bytes=0;
  for(int it=0;it<100000;it++){ char*d=dst+(it%ndg)*n; const char*s=src+(it%8)*65536+48;
    if(nt) ntcopy(d,s,n); else memcpy(d,s,n); bytes+=n;}
  double t=now()-t0; printf("targets %zu MiB nt=%d: %.1f GB/s\n",tpool>>20,nt,bytes/t/1e9);
}
