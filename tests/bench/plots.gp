# Plots the .dat files tessera_bench writes. Usage: gnuplot -e "dir='docs/benchmarks'" plots.gp
if (!exists("dir")) dir = "docs/benchmarks"
set terminal pngcairo size 800,480 font "sans,10"
set grid
set key top left

set output dir."/latency_vs_load.png"
set title "Tiny op (4 KiB add, Launch wait) latency vs offered load, 16 in flight, open loop"
set xlabel "offered load (requests/s)"
set ylabel "latency (µs)"
set logscale y
plot dir."/latency_vs_load.dat" using 1:2 with linespoints title "echo p50", \
     "" using 1:3 with linespoints title "echo p99", \
     "" using 1:4 with linespoints title "Tessera p50", \
     "" using 1:5 with linespoints title "Tessera p99"
unset logscale y

set output dir."/throughput_vs_tenants.png"
set title "Equal tenants saturating (matmul n=256, 2 in flight each)"
set xlabel "tenants"
set ylabel "ops/s"
set logscale x 2
set xtics (1, 4, 16)
set y2label "Jain fairness index"
set y2range [0:1.05]
set y2tics
plot dir."/throughput_vs_tenants.dat" using 1:2 with linespoints title "aggregate", \
     "" using 1:3 with linespoints title "slowest tenant", \
     "" using 1:4 with linespoints title "fastest tenant", \
     "" using 1:5 axes x1y2 with linespoints title "Jain index (right axis)"
unset logscale x
unset y2label
unset y2tics
set xtics autofreq

set output dir."/fairness_over_time.png"
set title "Busy-time share per 250 ms, compute shares 1:2:4 (expected 14 %, 29 %, 57 %)"
set xlabel "time (s)"
set ylabel "share of busy time"
set yrange [0:1]
plot dir."/fairness_over_time.dat" using 1:2 with lines title "weight 1", \
     "" using 1:3 with lines title "weight 2", \
     "" using 1:4 with lines title "weight 4", \
     1.0/7 dashtype 2 notitle, 2.0/7 dashtype 2 notitle, 4.0/7 dashtype 2 notitle
