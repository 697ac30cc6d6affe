#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(int argc,char**argv){ double end=now()+atof(argv[1]); volatile unsigned long x=1;
 while(now()<end){ double t=now(); long it=0; while(now()-t<0.5){ for(int i=0;i<100000;i++) x=x*6364136223846793005UL+1; it++; }
  time_t s=time(0); struct tm*tm=localtime(&s); printf("%02d:%02d:%02d %.0f\n",tm->tm_hour,tm->tm_min,tm->tm_sec,it*1e5/(now()-t)/1e6); fflush(stdout);} }
