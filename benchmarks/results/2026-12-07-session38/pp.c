#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>
#include <stdlib.h>
static _Atomic int flag __attribute__((aligned(64)));
static int N = 200000;
static void pin(int c){cpu_set_t s;CPU_ZERO(&s);CPU_SET(c,&s);pthread_setaffinity_np(pthread_self(),sizeof s,&s);}
static void* other(void* a){pin(1);for(int i=0;i<N;i++){while(atomic_load_explicit(&flag,memory_order_acquire)!=2*i+1);atomic_store_explicit(&flag,2*i+2,memory_order_release);}return 0;}
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(int argc,char**argv){int reps=argc>1?atoi(argv[1]):1;pin(0);
for(int r=0;r<reps;r++){atomic_store(&flag,0);pthread_t t;pthread_create(&t,0,other,0);
double t0=now();for(int i=0;i<N;i++){atomic_store_explicit(&flag,2*i+1,memory_order_release);while(atomic_load_explicit(&flag,memory_order_acquire)!=2*i+2);}
double t1=now();pthread_join(t,0);printf("round trip %.1f ns\n",(t1-t0)/N*1e9);fflush(stdout);if(r+1<reps)sleep(5);}
}
