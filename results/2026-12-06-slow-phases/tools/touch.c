#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
int main(int argc,char**argv){ size_t n=(size_t)atol(argv[1])<<30; char*p=mmap(0,n,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0); if(p==MAP_FAILED){perror("mmap");return 1;} for(size_t i=0;i<n;i+=4096)p[i]=1; munmap(p,n); puts("touched"); }
