#!/usr/bin/env python3
"""Writes the hostile images the fault and server tests send: huge.png (a valid PNG declaring 40000x40000 pixels that
holds one row) and wide.png (a whole 20000x1 PNG), encoded here with zlib.
  make-images.py DIR"""
import struct, sys, zlib


def png(w, h, rows):
    chunk = lambda t, d: struct.pack('>I', len(d)) + t + d + struct.pack('>I', zlib.crc32(t + d) & 0xffffffff)
    return (b'\x89PNG\r\n\x1a\n' + chunk(b'IHDR', struct.pack('>IIBBBBB', w, h, 8, 2, 0, 0, 0)) +
            chunk(b'IDAT', zlib.compress(b''.join(b'\x00' + b'\x80' * (3 * w) for _ in range(rows)))) +
            chunk(b'IEND', b''))


open(sys.argv[1] + '/huge.png', 'wb').write(png(40000, 40000, 1))
open(sys.argv[1] + '/wide.png', 'wb').write(png(20000, 1, 1))
