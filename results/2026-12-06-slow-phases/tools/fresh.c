#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <stdlib.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(int argc,char**argv){ size_t n=256<<20; double end=now()+atof(argv[1]);
 while(now()<end){ double t=now(); size_t bytes=0;
  while(now()-t<0.5){ char*p=mmap(0,n,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS|MAP_POPULATE,-1,0); memset(p,1,n); munmap(p,n); bytes+=n; }
  double dt=now()-t; time_t s=time(0); struct tm*tm=localtime(&s); printf("%02d:%02d:%02d fresh %.0f MB/s\n",tm->tm_hour,tm->tm_min,tm->tm_sec,bytes/dt/1e6); fflush(stdout);} }
