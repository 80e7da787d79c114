// Reads SGF text on stdin with Sabaki's parser (@sabaki/sgf) and prints, as JSON, what
// Sabaki would show: the root's properties and, along the main line, each node's move and
// win rate (SBKV).
const fs = require("fs");
const sgf = require("@sabaki/sgf");

const [root] = sgf.parse(fs.readFileSync(0, "utf8"));
const line = [];
for (let node = root.children[0]; node; node = node.children[0]) {
  const color = node.data.B ? "B" : node.data.W ? "W" : null;
  line.push({
    color,
    move: color ? node.data[color][0] : null,
    winrate: node.data.SBKV ? parseFloat(node.data.SBKV[0]) : null,
  });
}
process.stdout.write(JSON.stringify({ root: root.data, line }));
