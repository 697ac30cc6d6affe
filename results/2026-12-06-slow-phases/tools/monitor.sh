for i in $(seq ${1:-40}); do
  echo "$(date +%T) $(bash /tmp/floor.sh | tail -1) $(bash /tmp/tcpfloor.sh)"
  sleep 8
done
