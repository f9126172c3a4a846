for i in 1 2 3; do for v in new old; do
  [ $v = old ] && P=/tmp/oldwt || P=/work/main
  sync; echo 3 > /proc/sys/vm/drop_caches
  (cd $P && HYPURA_ROUTING_DIR=/tmp/rt-ab-$v-$i /work/main/.venv/bin/python -m hypura.cli.main bench /mnt/ramdisk/q3s8.gguf --ram 2GiB -p 0 -n 16 -r 3 -t 2 2>&1 | grep -E "^decode:" | sed "s/^/$v: /")
done; done
