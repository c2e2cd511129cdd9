"""What enters the engine from outside, checked alike for both shells (engine and offline): rule files loaded
and checked, events decoded and their clocks believed."""
