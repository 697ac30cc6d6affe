import socket, sys, time
mode, addr = sys.argv[1], sys.argv[2]
host, port = addr.split(':'); port = int(port)
if mode == 'listen':
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((host, port)); s.listen(1)
    c, _ = s.accept(); n = 0; buf = bytearray(1 << 20); mv = memoryview(buf)
    while True:
        k = c.recv_into(mv)
        if k == 0: break
        n += k
    print(n)
else:
    c = socket.create_connection((host, port)); data = b'x' * (1 << 20); n = 0
    t0 = time.time()
    while time.time() - t0 < 1.0:
        c.sendall(data); n += len(data)
    c.shutdown(socket.SHUT_WR); c.recv(1); dt = time.time() - t0
    print("tcpfloor %.0f" % (n / dt / 1e6))
