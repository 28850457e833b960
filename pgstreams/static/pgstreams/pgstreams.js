/*
 * pgstreams browser client: follows one stream over a WebSocket, in order and exactly once,
 * reconnecting with backoff and resuming after the last offset it received.
 *
 *   const s = new PgStream("/ws/pgstreams/<stream id>/", {
 *     onChunk(data, offset) {}, onEnd(nextOffset) {}, onError(error) {}, onStatus(text) {},
 *   });
 *   s.close();
 *
 * onChunk's data is a string, or a Uint8Array in a stream of a binary content type.
 * Options: from (first offset, default 0), ackEvery (chunks between acks, default 128, or
 * fewer once they are 256 Ki characters of frames; a slower stream's chunks are acknowledged a
 * second after the first of them), maxDelay (ms, the longest pause between reconnects, default
 * 10000).
 */
(function (global) {
  "use strict";

  // How long an ack may wait for ackEvery chunks (ms). Each ack is a message the server reads:
  // at a model's 30 tokens a second, every 250 ms was four a second per socket, for a window of
  // 1,024 chunks that a second's tokens hardly begin to fill.
  const ACK_DELAY = 1000;
  // Frames' characters after which an ack goes at once: a quarter of the server's 1 MiB window
  // is at most 3/4 of it in UTF-8, so large chunks never wait for the timer with the window full.
  const ACK_CHARS = 256 * 1024;

  // Close codes after which reconnecting cannot help.
  const PERMANENT = {
    4400: "bad request",
    4403: "not authorized",
    4404: "unknown stream",
    4410: "chunks pruned",
  };

  class PgStream {
    constructor(url, options = {}) {
      this.url = url;
      this.next = options.from || 0;
      this.onChunk = options.onChunk || function () {};
      this.onEnd = options.onEnd || function () {};
      this.onError = options.onError || function () {};
      this.onStatus = options.onStatus || function () {};
      this.ackEvery = options.ackEvery || 128;
      this.maxDelay = options.maxDelay || 10000;
      this.attempt = 0;
      this.acked = this.next;
      this.unackedChars = 0; // of the frames read since the last ack
      this.lastFrame = null; // the id of the last frame read, which an ack names
      this.ackTimer = null;
      this.finished = false;
      this.lastError = null;
      this._connect();
    }

    close() {
      this.finished = true;
      clearTimeout(this.ackTimer);
      clearTimeout(this.retryTimer);
      if (this.ws) this.ws.close(1000);
    }

    _connect() {
      const target = new URL(this.url, global.location.href);
      if (target.protocol === "http:") target.protocol = "ws:";
      if (target.protocol === "https:") target.protocol = "wss:";
      target.searchParams.set("from", String(this.next));
      const ws = (this.ws = new WebSocket(target.href));
      this.acked = this.next;
      this.unackedChars = 0;
      clearTimeout(this.ackTimer); // an ack timer of the socket before would otherwise stop this one's
      this.ackTimer = null;
      this.lastError = null; // this socket's error frame: why it closes
      this.onStatus(this.attempt ? "reconnecting" : "connecting");

      ws.onopen = () => this.onStatus("live");
      ws.onmessage = (event) => this._receive(ws, JSON.parse(event.data), event.data.length);
      ws.onclose = (event) => {
        clearTimeout(this.ackTimer);
        if (this.finished || ws !== this.ws) return;
        // The error frame decides, not the close code: a server that resets the connection
        // (daphne does when the close is not answered within a second) loses the close frame.
        const error = this.lastError || {};
        const code = error.code || event.code;
        if (code in PERMANENT) {
          this.finished = true;
          this.onStatus("failed");
          this.onError({
            code: code,
            message: error.message || PERMANENT[code],
            firstOffset: error.first_offset, // 4410: where reading can resume
          });
          return;
        }
        this._retry();
      };
    }

    _retry() {
      const delay = Math.min(this.maxDelay, 250 * 2 ** this.attempt);
      this.attempt += 1;
      this.onStatus("reconnecting");
      this.retryTimer = setTimeout(() => this._connect(), delay / 2 + (Math.random() * delay) / 2);
    }

    _receive(ws, message, chars) {
      if (message.type === "chunks") {
        this.unackedChars += chars;
        this.attempt = 0;
        for (const item of message.items) {
          if (item.offset < this.next) continue; // already shown: never twice
          if (item.offset > this.next) {
            // A gap cannot happen on one connection; resume from what we have (onclose retries).
            ws.close(4000);
            return;
          }
          this.next = item.offset + 1;
          this.onChunk(item.encoding === "base64" ? decodeBase64(item.data) : item.data, item.offset);
        }
        this.lastFrame = message.frame;
        this._ack(ws);
      } else if (message.type === "end") {
        this.finished = true;
        clearTimeout(this.ackTimer);
        ws.close(1000); // the client closes: nothing is left for it to read
        this.onStatus("done");
        this.onEnd(message.next_offset);
      } else if (message.type === "error") {
        this.lastError = message;
        ws.close(1000); // the server closes next; closing first leaves nothing to cut off
      }
    }

    _ack(ws) {
      // Acknowledge what was shown: the server sends at most a window ahead of the last ack.
      const send = () => {
        this.ackTimer = null;
        if (ws.readyState === WebSocket.OPEN && this.next > this.acked) {
          ws.send(JSON.stringify({ type: "ack", frame: this.lastFrame }));
          this.acked = this.next;
          this.unackedChars = 0;
        }
      };
      if (this.next - this.acked >= this.ackEvery || this.unackedChars >= ACK_CHARS) {
        clearTimeout(this.ackTimer);
        send();
      } else if (!this.ackTimer) {
        this.ackTimer = setTimeout(send, ACK_DELAY);
      }
    }
  }

  // A chunk of a binary stream arrives in base64: it is delivered as a Uint8Array.
  function decodeBase64(text) {
    return Uint8Array.from(atob(text), (c) => c.charCodeAt(0));
  }

  global.PgStream = PgStream;
})(window);
