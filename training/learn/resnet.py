"""The network itself: a ResNet with a policy and a value head, and KataGo's optional parts.

`PolicyValueNet(board_size, blocks, filters, history, value_hidden, ...)`: a conv stem,
`blocks` residual blocks (two 3x3 convs with BatchNorm and ReLU), a policy head giving N*N+1
logits (pass last) and a value head giving tanh in [-1, 1] from the side to move's view.
Options from KataGo ("Accelerating Self-Play Learning in Go", Wu 2019), each off by default
so that model files written without them rebuild the same net:
- `global_pooling`: every other block from the second is a global pooling block, and the
  policy head is KataGo's (1x1 convs, a bias from global pooling, a logit per point, pass
  from the pooled features). Pooling is mean, mean * (N - 14) / 10 and max over the board.
- `ownership_head`: the final owner of every point, pre-tanh [B, N*N] (side to move's view).
- `score_head`: the final area margin / N from the side to move's view, komi included [B].
- `opponent_policy_head`: logits [B, N*N+1] of the opponent's reply (the next move's target).
`forward(x)` returns (policy logits, value) and is what the evaluator traces;
`forward(x, heads=True)` returns a dict with every head, for training only.

Model files, the config's net and the batched evaluator are `training.learn.net`. This module
must not read or write files, or know about search or games.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from training.go.features import num_planes


class _ResidualBlock(nn.Module):
    def __init__(self, filters: int):
        super().__init__()
        self.conv1 = nn.Conv2d(filters, filters, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(filters)
        self.conv2 = nn.Conv2d(filters, filters, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(filters)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(x + self.bn2(self.conv2(y)))


def global_pool(x: torch.Tensor) -> torch.Tensor:
    """KataGo's global pooling: [B, C, N, N] -> [B, 3C] (mean, mean * (N - 14) / 10, max).

    Invariant under the 8 board symmetries; the scaled mean lets one net tell board sizes
    apart (a constant factor of the mean for a fixed N).
    """
    mean = x.mean(dim=(2, 3))
    return torch.cat([mean, mean * ((x.shape[-1] - 14) / 10.0), x.amax(dim=(2, 3))], dim=1)


class _PoolingBlock(nn.Module):
    """A residual block with KataGo's global pooling bias structure.

    The first 3x3 conv's output is split: `pool` channels go through BatchNorm, ReLU and
    global pooling, and a linear layer turns them into a per-channel bias of the other
    channels, which then feed the second conv. So every point sees a summary of the whole
    board (life and death elsewhere, who is ahead) at the cost of one small linear layer.
    """

    def __init__(self, filters: int, pool: int):
        super().__init__()
        assert 1 <= pool < filters, (pool, filters)
        self.regular = filters - pool
        self.conv1 = nn.Conv2d(filters, filters, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(self.regular)
        self.pool_bn = nn.BatchNorm2d(pool)
        self.pool_fc = nn.Linear(3 * pool, self.regular)
        self.conv2 = nn.Conv2d(self.regular, filters, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(filters)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv1(x)
        g = F.relu(self.pool_bn(y[:, self.regular :]))
        bias = self.pool_fc(global_pool(g))
        y = F.relu(self.bn1(y[:, : self.regular]) + bias[:, :, None, None])
        return F.relu(x + self.bn2(self.conv2(y)))


class _PooledPolicyHead(nn.Module):
    """KataGo's policy head: [B, F, N, N] -> logits [B, outputs, N*N+1] (pass last).

    P = conv1x1(trunk); G = conv1x1(trunk) -> BN -> ReLU -> global pooling; P gets a
    per-channel bias from G, then BN, ReLU and a 1x1 conv give one logit per point and
    output; the pass logit comes from G alone. Output 0 is the policy, then (where the net has
    them) the opponent's reply and the soft policy.
    """

    def __init__(self, filters: int, channels: int, outputs: int):
        super().__init__()
        self.p_conv = nn.Conv2d(filters, channels, 1, bias=False)
        self.g_conv = nn.Conv2d(filters, channels, 1, bias=False)
        self.g_bn = nn.BatchNorm2d(channels)
        self.g_fc = nn.Linear(3 * channels, channels)
        self.p_bn = nn.BatchNorm2d(channels)
        self.out_conv = nn.Conv2d(channels, outputs, 1)
        self.pass_fc = nn.Linear(3 * channels, outputs)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        g = global_pool(F.relu(self.g_bn(self.g_conv(h))))
        p = self.p_conv(h) + self.g_fc(g)[:, :, None, None]
        points = self.out_conv(F.relu(self.p_bn(p))).flatten(2)  # [B, outputs, N*N]
        return torch.cat([points, self.pass_fc(g)[:, :, None]], dim=2)


class PolicyValueNet(nn.Module):
    """AlphaZero ResNet: planes [B, C, N, N] -> (policy logits [B, N*N+1], value [B]),
    with KataGo's optional global pooling and training-only heads (see the module docs)."""

    def __init__(
        self,
        board_size: int,
        blocks: int,
        filters: int,
        history: int,
        value_hidden: int,
        global_pooling: bool = False,
        ownership_head: bool = False,
        score_head: bool = False,
        opponent_policy_head: bool = False,
        liberties: bool = False,
        soft_policy_head: bool = False,
    ):
        super().__init__()
        assert 2 <= board_size <= 25, board_size
        assert blocks >= 1 and filters >= 1 and history >= 1 and value_hidden >= 1
        self.board_size = board_size
        self.blocks = blocks
        self.filters = filters
        self.history = history
        self.value_hidden = value_hidden
        self.global_pooling = bool(global_pooling)
        self.ownership_head = bool(ownership_head)
        self.score_head = bool(score_head)
        self.opponent_policy_head = bool(opponent_policy_head)
        self.liberties = bool(liberties)
        self.soft_policy_head = bool(soft_policy_head)
        self.in_planes = num_planes(history, self.liberties)
        self.num_moves = board_size * board_size + 1
        points = board_size * board_size

        self.stem = nn.Sequential(
            nn.Conv2d(self.in_planes, filters, 3, padding=1, bias=False),
            nn.BatchNorm2d(filters),
            nn.ReLU(inplace=True),
        )
        # KataGo puts pooling in a few blocks spread over the tower: here blocks 2, 4, 6, ...
        pool = max(1, filters // 4)
        self.tower = nn.Sequential(*[
            _PoolingBlock(filters, pool) if self.global_pooling and i % 2 == 1
            else _ResidualBlock(filters)
            for i in range(blocks)
        ])
        policies = 1 + self.opponent_policy_head + self.soft_policy_head
        if self.global_pooling:
            self.policy_head = _PooledPolicyHead(filters, max(8, filters // 2), policies)
        else:
            self.policy_conv = nn.Sequential(
                nn.Conv2d(filters, 2, 1, bias=False), nn.BatchNorm2d(2), nn.ReLU(inplace=True)
            )
            self.policy_fc = nn.Linear(2 * points, self.num_moves)
            if self.opponent_policy_head:
                self.opponent_policy_fc = nn.Linear(2 * points, self.num_moves)
            if self.soft_policy_head:
                self.soft_policy_fc = nn.Linear(2 * points, self.num_moves)
        self.value_conv = nn.Sequential(
            nn.Conv2d(filters, 1, 1, bias=False), nn.BatchNorm2d(1), nn.ReLU(inplace=True)
        )
        self.value_fc1 = nn.Linear(points, value_hidden)
        self.value_fc2 = nn.Linear(value_hidden, 1)
        if self.score_head:
            self.score_fc = nn.Linear(value_hidden, 1)
        if self.ownership_head:
            self.ownership_conv = nn.Conv2d(filters, 1, 1)

    @property
    def config(self) -> dict[str, Any]:
        """The constructor arguments; stored in model files so they rebuild the net."""
        return {
            "board_size": self.board_size,
            "blocks": self.blocks,
            "filters": self.filters,
            "history": self.history,
            "value_hidden": self.value_hidden,
            "global_pooling": self.global_pooling,
            "ownership_head": self.ownership_head,
            "score_head": self.score_head,
            "opponent_policy_head": self.opponent_policy_head,
            # only when on: the configs of nets without it stay what older files hold
            **({"liberties": True} if self.liberties else {}),
            **({"soft_policy_head": True} if self.soft_policy_head else {}),
        }

    def forward(self, x: torch.Tensor, heads: bool = False, score: bool = False) -> Any:
        """(policy logits [B, N*N+1], value [B]); with `score`, a third output, the score
        head's margin / N [B] (zeros without the head; the search's score utility); with
        `heads`, a dict of every head: policy, value, and where present ownership (pre-tanh
        [B, N*N]), score [B], opponent_policy and soft_policy [B, N*N+1]."""
        h = self.tower(self.stem(x))
        soft = None
        if self.global_pooling:
            both = self.policy_head(h)
            logits = both[:, 0]
            opponent = both[:, 1] if self.opponent_policy_head else None
            soft = both[:, -1] if self.soft_policy_head else None
        else:
            p = self.policy_conv(h).flatten(1)
            logits = self.policy_fc(p)
            opponent = self.opponent_policy_fc(p) if self.opponent_policy_head and heads \
                else None
            soft = self.soft_policy_fc(p) if self.soft_policy_head and heads else None
        v = F.relu(self.value_fc1(self.value_conv(h).flatten(1)))
        value = torch.tanh(self.value_fc2(v)).squeeze(1)
        if not heads:
            if score:
                margin = self.score_fc(v).squeeze(1) if self.score_head \
                    else torch.zeros_like(value)
                return logits, value, margin
            return logits, value
        out = {"policy": logits, "value": value}
        if opponent is not None:
            out["opponent_policy"] = opponent
        if soft is not None:
            out["soft_policy"] = soft
        if self.score_head:
            out["score"] = self.score_fc(v).squeeze(1)
        if self.ownership_head:
            out["ownership"] = self.ownership_conv(h).flatten(1)
        return out
