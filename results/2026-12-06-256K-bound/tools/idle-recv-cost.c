#include <stdio.h>
#include <string.h>
#include <time.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <netinet/udp.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e9+t.tv_nsec;}
int main(){
  int fd=socket(AF_INET,SOCK_DGRAM,0); struct sockaddr_in a={.sin_family=AF_INET}; bind(fd,(void*)&a,sizeof a);
  int one=1; setsockopt(fd,17,104,&one,4);
  static char buf[70000]; struct sockaddr_in6 from; socklen_t fl; char ctl[32]; int n=2000000;
  for(int rep=0;rep<3;rep++){
  double t0=now(); for(int i=0;i<n;i++){ fl=sizeof from; recvfrom(fd,buf,sizeof buf,MSG_DONTWAIT|MSG_TRUNC,(void*)&from,&fl);} double t1=now();
  for(int i=0;i<n;i++){ struct iovec iov={buf,sizeof buf}; struct msghdr m={.msg_name=&from,.msg_namelen=sizeof from,.msg_iov=&iov,.msg_iovlen=1,.msg_control=ctl,.msg_controllen=sizeof ctl}; recvmsg(fd,&m,MSG_DONTWAIT);} double t2=now();
  for(int i=0;i<n;i++){ struct iovec iov={buf,sizeof buf}; struct msghdr m={.msg_name=&from,.msg_namelen=sizeof from,.msg_iov=&iov,.msg_iovlen=1}; recvmsg(fd,&m,MSG_DONTWAIT);} double t3=now();
  printf("recvfrom %.0f ns, recvmsg+cmsg %.0f ns, recvmsg %.0f ns\n",(t1-t0)/n,(t2-t1)/n,(t3-t2)/n);}
}
