// tcp/udp ping-pong, busy-polling nonblocking sockets. usage: tpp tcp|udp|udpc server|client IP PORT [iters]
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <fcntl.h>
#include <time.h>
#include <errno.h>
#include <arpa/inet.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e6+t.tv_nsec*1e-3;}
int main(int c,char**v){
  int tcp=!strcmp(v[1],"tcp"), conn=!strcmp(v[1],"udpc"), srv=!strcmp(v[2],"server"); int iters=c>5?atoi(v[5]):100000;
  struct sockaddr_in a={0}; a.sin_family=AF_INET; a.sin_port=htons(atoi(v[4])); inet_pton(AF_INET,v[3],&a.sin_addr);
  struct sockaddr_in peer; socklen_t pl=sizeof peer; int fd; char buf[64]={0}; int one=1;
  if(tcp){ int s=socket(AF_INET,SOCK_STREAM,0); setsockopt(s,SOL_SOCKET,SO_REUSEADDR,&one,4);
    if(srv){ bind(s,(void*)&a,sizeof a); listen(s,1); fd=accept(s,0,0);} else { while(connect(s,(void*)&a,sizeof a)) usleep(10000); fd=s;}
    setsockopt(fd,IPPROTO_TCP,TCP_NODELAY,&one,4);
  } else { fd=socket(AF_INET,SOCK_DGRAM,0);
    if(srv){ bind(fd,(void*)&a,sizeof a);} else { if(conn) connect(fd,(void*)&a,sizeof a); peer=a; } }
  fcntl(fd,F_SETFL,O_NONBLOCK); if(getenv("GRO")) { if(setsockopt(fd,17,104,&one,4)) perror("gro"); }
  int n=8; double t0=0;
  for(int i=0;i<iters+1000;i++){
    if(i==1000) t0=now();
    if(srv){ int r; do { r = tcp? recv(fd,buf,n,0) : recvfrom(fd,buf,n,0,(void*)&peer,&pl);} while(r<=0);
      if(tcp) send(fd,buf,n,0); else sendto(fd,buf,n,0,(void*)&peer,sizeof peer); }
    else { if(tcp||conn) send(fd,buf,n,0); else sendto(fd,buf,n,0,(void*)&peer,sizeof peer);
      int r; do { r = recv(fd,buf,n,0);} while(r<=0); }
  }
  if(!srv) printf("%s one-way %.2f us\n",v[1],(now()-t0)/iters/2);
  return 0;
}
