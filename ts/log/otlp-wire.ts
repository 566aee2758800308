// OTLP's ExportLogsServiceRequest in protobuf, written by hand for the access records (why: the SDK's log pipeline
// cost about 135 µs of the main thread per record and @bufbuild/protobuf's generic BinaryWriter about 65 µs; this
// writes a record's ~20 attributes in a few µs): sizes are computed first, then every field is written once into one
// buffer per batch. Field numbers are opentelemetry-proto's (collector/logs/v1, logs/v1, resource/v1, common/v1).

export type AttributeValue = string | number | boolean;
export type Attributes = Readonly<Record<string, AttributeValue>>;

export interface LogRecordIn {
  readonly timeMs: number;
  readonly severityNumber: number;
  readonly severityText: string;
  readonly body: string;
  readonly attributes: Attributes;
  /** More attributes, written after `attributes` (so a caller need not copy one object into another). */
  readonly more?: Attributes;
}

const LEN = 2; // wire type: length-delimited
const VARINT = 0;
const I64 = 1;
const tag = (field: number, wire: number): number => (field << 3) | wire;

const T = {
  requestResourceLogs: tag(1, LEN),
  resourceLogsResource: tag(1, LEN),
  resourceLogsScopeLogs: tag(2, LEN),
  resourceAttributes: tag(1, LEN),
  scopeLogsScope: tag(1, LEN),
  scopeLogsRecord: tag(2, LEN),
  scopeName: tag(1, LEN),
  recordTime: tag(1, I64),
  recordSeverityNumber: tag(2, VARINT),
  recordSeverityText: tag(3, LEN),
  recordBody: tag(5, LEN),
  recordAttribute: tag(6, LEN),
  recordObservedTime: tag(11, I64),
  keyValueKey: tag(1, LEN),
  keyValueValue: tag(2, LEN),
  anyString: tag(1, LEN),
  anyBool: tag(2, VARINT),
  anyInt: tag(3, VARINT),
  anyDouble: tag(4, I64),
} as const;

function varintSize(n: number): number {
  let s = 1;
  while (n >= 128) {
    n = Math.floor(n / 128);
    s++;
  }
  return s;
}

/** int64 as protobuf writes it: a negative value is its 64-bit two's complement (ten bytes). */
const int64Size = (v: number): number => (v < 0 ? 10 : varintSize(v));

/** UTF-8 length; short ASCII strings (nearly every attribute) without a call into Node's C++ side. */
function utf8Length(s: string): number {
  if (s.length > 64) return Buffer.byteLength(s);
  for (let i = 0; i < s.length; i++) if (s.charCodeAt(i) > 127) return Buffer.byteLength(s);
  return s.length;
}

function anySize(v: AttributeValue): number {
  if (typeof v === 'string') {
    const n = utf8Length(v);
    return 1 + varintSize(n) + n;
  }
  if (typeof v === 'boolean') return 2;
  return Number.isInteger(v) ? 1 + int64Size(v) : 9;
}

const stringFieldSize = (s: string): number => {
  const n = utf8Length(s);
  return 1 + varintSize(n) + n;
};

/**
 * A KeyValue's key field (tag, length, UTF-8), encoded once per key: access records use a fixed vocabulary of keys,
 * so a record's keys cost a lookup and a copy. Bounded, in case a caller's keys are not a vocabulary.
 */
const keyFields = new Map<string, Uint8Array>();

function keyField(k: string): Uint8Array {
  let f = keyFields.get(k);
  if (f === undefined) {
    const utf8 = Buffer.from(k);
    f = new Uint8Array(1 + varintSize(utf8.length) + utf8.length);
    let i = 0;
    f[i++] = T.keyValueKey;
    for (let n = utf8.length; ; n = Math.floor(n / 128)) {
      if (n < 128) {
        f[i++] = n;
        break;
      }
      f[i++] = (n % 128) | 128;
    }
    f.set(utf8, i);
    if (keyFields.size < 4096) keyFields.set(k, f);
  }
  return f;
}

function keyValueSize(k: string, v: AttributeValue): number {
  const a = anySize(v);
  return keyField(k).length + 1 + varintSize(a) + a;
}

function attributesSize(attrs: Attributes): number {
  let n = 0;
  for (const k in attrs) {
    const kv = keyValueSize(k, attrs[k] as AttributeValue);
    n += 1 + varintSize(kv) + kv;
  }
  return n;
}

function recordSize(r: LogRecordIn): number {
  const body = anySize(r.body);
  const attrs = attributesSize(r.attributes) + (r.more === undefined ? 0 : attributesSize(r.more));
  return 9 + 9 + 1 + varintSize(r.severityNumber) + stringFieldSize(r.severityText) + 1 + varintSize(body) + body + attrs;
}

/** A growing buffer with protobuf's primitives. */
class Out {
  buf: Buffer;
  pos = 0;

  constructor(size: number) {
    this.buf = Buffer.allocUnsafe(size);
  }

  private room(n: number): void {
    if (this.pos + n <= this.buf.length) return;
    const next = Buffer.allocUnsafe(Math.max(this.buf.length * 2, this.pos + n));
    this.buf.copy(next, 0, 0, this.pos);
    this.buf = next;
  }

  varint(n: number): void {
    this.room(10);
    while (n >= 128) {
      this.buf[this.pos++] = (n % 128) | 128;
      n = Math.floor(n / 128);
    }
    this.buf[this.pos++] = n;
  }

  int64(v: number): void {
    if (v >= 0) return this.varint(v);
    this.room(10);
    let u = BigInt.asUintN(64, BigInt(v));
    for (let i = 0; i < 9; i++) {
      this.buf[this.pos++] = Number(u & 0x7fn) | 128;
      u >>= 7n;
    }
    this.buf[this.pos++] = Number(u);
  }

  string(t: number, s: string): void {
    const n = utf8Length(s);
    this.varint(t);
    this.varint(n);
    this.room(n);
    if (n === s.length) {
      // ASCII: one byte per character.
      const buf = this.buf;
      let pos = this.pos;
      for (let i = 0; i < n; i++) buf[pos++] = s.charCodeAt(i);
      this.pos = pos;
    } else {
      this.pos += this.buf.write(s, this.pos, 'utf8');
    }
  }

  fixed64(t: number, v: bigint): void {
    this.varint(t);
    this.room(8);
    this.buf.writeBigUInt64LE(v, this.pos);
    this.pos += 8;
  }

  anyValue(v: AttributeValue): void {
    if (typeof v === 'string') return this.string(T.anyString, v);
    if (typeof v === 'boolean') {
      this.varint(T.anyBool);
      return this.varint(v ? 1 : 0);
    }
    if (Number.isInteger(v)) {
      this.varint(T.anyInt);
      return this.int64(v);
    }
    this.varint(T.anyDouble);
    this.room(8);
    this.buf.writeDoubleLE(v, this.pos);
    this.pos += 8;
  }

  attributes(t: number, attrs: Attributes): void {
    for (const k in attrs) {
      const v = attrs[k] as AttributeValue;
      this.varint(t);
      const key = keyField(k);
      const a = anySize(v);
      this.varint(key.length + 1 + varintSize(a) + a);
      this.room(key.length);
      for (let i = 0; i < key.length; i++) this.buf[this.pos++] = key[i] as number;
      this.varint(T.keyValueValue);
      this.varint(a);
      this.anyValue(v);
    }
  }

  record(r: LogRecordIn, size: number): void {
    this.varint(T.scopeLogsRecord);
    this.varint(size);
    const nanos = BigInt(r.timeMs) * 1_000_000n;
    this.fixed64(T.recordTime, nanos);
    this.fixed64(T.recordObservedTime, nanos);
    this.varint(T.recordSeverityNumber);
    this.varint(r.severityNumber);
    this.string(T.recordSeverityText, r.severityText);
    this.varint(T.recordBody);
    this.varint(anySize(r.body));
    this.anyValue(r.body);
    this.attributes(T.recordAttribute, r.attributes);
    if (r.more !== undefined) this.attributes(T.recordAttribute, r.more);
  }

  bytes(): Uint8Array {
    return Uint8Array.prototype.slice.call(this.buf, 0, this.pos);
  }
}

/** Encodes batches of one resource's records under one instrumentation scope. */
export class LogsRequestWriter {
  private readonly resourceSize: number;
  private readonly scopeSize: number;

  constructor(
    private readonly resource: Attributes,
    private readonly scope: string,
  ) {
    this.resourceSize = attributesSize(resource);
    this.scopeSize = stringFieldSize(scope);
  }

  encode(records: readonly LogRecordIn[]): Uint8Array {
    const sizes = records.map(recordSize);
    let scopeLogs = 1 + varintSize(this.scopeSize) + this.scopeSize;
    for (const s of sizes) scopeLogs += 1 + varintSize(s) + s;
    const resourceLogs = 1 + varintSize(this.resourceSize) + this.resourceSize + 1 + varintSize(scopeLogs) + scopeLogs;
    const total = 1 + varintSize(resourceLogs) + resourceLogs;
    const out = new Out(total);
    out.varint(T.requestResourceLogs);
    out.varint(resourceLogs);
    out.varint(T.resourceLogsResource);
    out.varint(this.resourceSize);
    out.attributes(T.resourceAttributes, this.resource);
    out.varint(T.resourceLogsScopeLogs);
    out.varint(scopeLogs);
    out.varint(T.scopeLogsScope);
    out.varint(this.scopeSize);
    out.string(T.scopeName, this.scope);
    records.forEach((r, i) => out.record(r, sizes[i] as number));
    // Every length written above was computed before its content: they must agree to the byte.
    if (out.pos !== total) throw new Error(`OTLP encoding wrote ${out.pos} bytes of a computed ${total}`);
    return out.bytes();
  }
}
