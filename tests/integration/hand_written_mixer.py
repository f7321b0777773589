"""An MLP-Mixer as users write their own (timm's MixerBlock layout): a
patch-embedding convolution, blocks that mix the tokens with an MLP over
the transposed sequence (x.transpose(1, 2): C tokens of T features) and
the channels with an MLP over each token, and a head on the mean of the
tokens."""
import torch.nn as nn

from hand_written_vit import Mlp  # fc1, GELU, fc2 (a dropout of p 0), as timm's Mlp


class MixerBlock(nn.Module):
    def __init__(self, dim, tokens):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp_tokens = Mlp(tokens, tokens * 2)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp_channels = Mlp(dim, dim * 4)

    def forward(self, x):
        x = x + self.mlp_tokens(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.mlp_channels(self.norm2(x))


class Mixer(nn.Module):
    def __init__(self, img=32, patch=8, dim=32, depth=2, classes=10):
        super().__init__()
        tokens = (img // patch) ** 2
        self.stem = nn.Conv2d(3, dim, patch, patch)
        self.blocks = nn.Sequential(*[MixerBlock(dim, tokens) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        x = self.stem(x).flatten(2).transpose(1, 2)
        x = self.norm(self.blocks(x))
        return self.head(x.mean(dim=1))
